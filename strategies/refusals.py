"""SuperNodes that do not fit the run: counted as failed, and a run they starve ends failed.

A SuperNode whose node config does not fit the run (``num-partitions=3`` in a run of ``num_clients=4``,
no ``partition-id``, one out of range) answers every message with an error: its ClientApp raises
:class:`fedpers.core.errors.NodeMismatchError` while building the client, and Flower hands the server a
``ValueError`` whose text holds that class name and message. Before this module the server took that for a
node lost before answering: the node was skipped, no round recorded it, and a run whose clients all
refused but one trained that one and ended "completed".

Now each refusal goes into the current round (``failed_clients`` + 1 once per node and round, and a
``refused_nodes`` list of ``{"node", "reason"}`` in the round's record), and the round stops the run
with one line when the nodes that fit the run are fewer than it needs: ``max(min_fit_updates, the
number of clients sampled per round)``. A node that refuses is asked again in the next round, so a
SuperNode restarted with the right node config is taken back.

Two more cases end the same way. A node whose partition id another connected node already holds is
refused with a ``refused_nodes`` entry naming that node (:func:`note_duplicate_partition`), the holder
keeps the partition: before, the later node silently took the partition's place. And a partition that was
sampled for training and never trained in the whole run (every fit sent to it failed or got no reply: a
ClientApp runner that stopped, a state directory that is full) ends the run failed at its end, in one line
(:func:`require_trained_partitions`), instead of "completed" on the other clients' updates.

Kept apart from ``strategies/base.py``: the round roster calls :func:`note_refusal` where a node does not
report its partition id and :func:`note_duplicate_partition` where it reports a held one, the base strategy
:func:`require_fitting_nodes` after sampling, and the round book :func:`require_trained_partitions` before
the run's summary, nothing else.
"""

from __future__ import annotations

import re
from logging import WARNING
from typing import Any

from flwr.common import log

from fedpers.core.errors import FedpersError, NodeMismatchError, cut
from fedpers.core.schema import clients_per_round

# Flower's error reply: "<class 'fedpers.core.errors.NodeMismatchError'>:<'MESSAGE'>"
_REASON = re.compile(r"<class '[\w.]*\b" + NodeMismatchError.__name__ + r"'>:<'(.*?)'>", re.S)


def refusal_reason(exc: BaseException) -> str | None:
    """Why a node refused the run, from the exception a ClientProxy raised for its error reply; None when
    the exception is not such a refusal (a lost node, a timeout, another client error)."""
    match = _REASON.search(str(exc))
    return match.group(1) if match else None


def note_refusal(round_state: dict[str, Any], server_round: int, node: str, exc: BaseException) -> bool:
    """Record in ``round_state`` (the strategy's current round) that ``node`` refused the run, if ``exc``
    says so: one failed client and one ``refused_nodes`` entry per node and round. Returns whether it was
    a refusal (False: the caller handles ``exc`` as before)."""
    reason = refusal_reason(exc)
    if reason is None:
        return False
    record_refusal(round_state, server_round, node, reason)
    return True


def note_duplicate_partition(round_state: dict[str, Any], server_round: int, node: str, partition_id: int,
                             holder: str) -> None:
    """Record in ``round_state`` that ``node`` is refused because it reports ``partition_id``, which the
    connected node ``holder`` holds (two SuperNodes started with the same ``partition-id``)."""
    record_refusal(round_state, server_round, node,
                   f"partition-id {partition_id} is held by node {holder} (each SuperNode needs its own partition-id)")


def record_refusal(round_state: dict[str, Any], server_round: int, node: str, reason: str) -> None:
    """One failed client and one ``refused_nodes`` entry for ``node`` in ``round_state``, once per node and
    round, and a warning."""
    refused = round_state.setdefault("extras", {}).setdefault("refused_nodes", [])
    if all(entry["node"] != str(node) for entry in refused):
        refused.append({"node": str(node), "reason": reason})
        round_state["failures"] = round_state.get("failures", 0) + 1
        log(WARNING, "round %d: node %s refuses this run: %s", server_round, node, reason)


def require_trained_partitions(sampled: set[int], answered: set[int], rounds: int) -> None:
    """Stop the run (FedpersError, one line) when a partition was sampled for training in its ``rounds``
    rounds and never answered a fit (valid or rejected): it never trained, and a summary of the other
    partitions' training would call the run completed."""
    never = sorted(set(sampled) - set(answered))
    if never:
        raise FedpersError(cut(
            f"partition(s) {', '.join(map(str, never))} never trained in {rounds} rounds: each fit sent to them "
            "failed or got no reply (failed_clients in metrics.jsonl; their SuperNode's and ClientApp's logs say "
            "why, e.g. a stopped ClientApp runner or a full state directory); no summary.json is written", 600))


def required_fitting_nodes(num_clients: int, fraction_fit: float, min_fit_updates: int) -> int:
    """How many nodes must fit the run: the clients sampled per round (``round(fraction_fit * K)``, at
    least 1), or ``min_fit_updates`` if that is more."""
    return max(int(min_fit_updates), clients_per_round(fraction_fit, num_clients))


def require_fitting_nodes(round_state: dict[str, Any], server_round: int, fitting: int, num_clients: int,
                          fraction_fit: float, min_fit_updates: int) -> None:
    """Stop the run (FedpersError, one line) when nodes refused this round and the ``fitting`` ones are
    fewer than :func:`required_fitting_nodes`; nothing happens when no node refused (a node lost on the
    way is the round timeout's and ``min_fit_updates``' business, as before)."""
    refused = round_state.get("extras", {}).get("refused_nodes", [])
    needed = required_fitting_nodes(num_clients, fraction_fit, min_fit_updates)
    if not refused or fitting >= needed:
        return
    reasons = sorted({entry["reason"] for entry in refused})
    raise FedpersError(cut(
        f"round {server_round}: {fitting} of num_clients={num_clients} clients have a SuperNode that fits the "
        f"run, fewer than the {needed} it needs (max of min_fit_updates={min_fit_updates} and the "
        f"{clients_per_round(fraction_fit, num_clients)} sampled per round); {len(refused)} node(s) refused: "
        f"{'; '.join(reasons)} (start each SuperNode with --node-config \"partition-id=N "
        f"num-partitions={num_clients}\")", 600))
