"""Error types that the CLI turns into one clear line and a non-zero exit code, and :func:`shown`, the
form in which those lines echo a user's value; :data:`STOP_REQUESTED`, what the round loop reads once a
run has been told to stop."""

import threading

# An error line echoes at most this many characters of a value: a 5 MB value in a config file must not
# become a 5 MB error line.
SHOWN_CHARS = 200


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters (with the length left out said), for an error line."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error line that echoes a user's value."""
    return cut(repr(value), limit)


# Set by the CLI's SIGINT / SIGTERM handler before the run unwinds. The replies a round gets after it are
# the engine stopping (its client actors ended in the middle of a message), not the clients' failures: a
# round aggregated from them is not the round an uninterrupted run has, so none is recorded or checkpointed
# (the strategy raises :class:`Stopping` instead; a resumed run redoes the round).
STOP_REQUESTED = threading.Event()


class FedpersError(Exception):
    """Base class for every error fedpers reports to a user without a traceback (exit code 2: bad input)."""

    exit_code = 2


class Stopping(FedpersError):
    """The run was told to stop (:data:`STOP_REQUESTED`) before this round's replies were aggregated."""


class ConfigError(FedpersError):
    """A config key is unknown, mistyped or out of range (the message names the key)."""


class DataError(FedpersError):
    """A dataset is missing, malformed, or cannot be partitioned as asked."""


class ClientUpdateError(FedpersError):
    """A message from the server to a client (or back) does not match the local model."""


class NodeMismatchError(ClientUpdateError):
    """A SuperNode's node config does not fit the run (no partition-id, another num-partitions, a
    partition-id out of range): it can answer no message of this run. The server reads the class name in
    the error reply Flower sends back (``strategies/refusals.py``) and counts the node as refusing."""


class EngineError(FedpersError):
    """The simulation engine (Flower, Ray) failed on its own, not on bad input: one line, exit code 1."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM, raised by the CLI's signal handler: unwinds like a KeyboardInterrupt and
    says which signal it was (``signum``), so that a sweep passes the same signal on to its runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# How long a round with failed replies waits for a stop before it is aggregated (ours): a SIGTERM sent to
# the whole process group (docker stop, Slurm) ends the client actors at the moment it reaches the driver,
# and a signal that lands on one of the engine's threads reaches the handler up to 0.5 s later
# (``fedpers.apps.cli._forwarder``); so failures can come before the stop is known. Rounds without
# failures do not wait.
STOP_GRACE_S = 1.0


def refuse_if_stopping(server_round: int, stage: str, failures: int = 0) -> None:
    """Raise :class:`Stopping` once the run has been told to stop (:data:`STOP_REQUESTED`; with
    ``failures``, after waiting up to :data:`STOP_GRACE_S` for it): the replies of a round cut by the stop
    are not aggregated, recorded or checkpointed, so that a resumed run redoes the round and gives an
    uninterrupted run's numbers."""
    if STOP_REQUESTED.is_set() or (failures and STOP_REQUESTED.wait(STOP_GRACE_S)):
        raise Stopping(f"round {server_round}: the run is stopping; its {stage} replies are not aggregated")
