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

Kept apart from ``strategies/base.py``: the base strategy calls :func:`note_refusal` where a node does not
report its partition id and :func:`require_fitting_nodes` after sampling, nothing else.
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
    refused = round_state.setdefault("extras", {}).setdefault("refused_nodes", [])
    if all(entry["node"] != str(node) for entry in refused):
        refused.append({"node": str(node), "reason": reason})
        round_state["failures"] = round_state.get("failures", 0) + 1
        log(WARNING, "round %d: node %s refuses this run: %s", server_round, node, reason)
    return True


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
