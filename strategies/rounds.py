"""Round mechanics shared by every fedpers strategy, apart from the hooks a method overrides.

* :class:`ClientRoster`: which Flower node holds which partition, the seeded fit sample of a round, the
  seeded evaluation sample, and the partition order that replies are aggregated in.
* :class:`RoundBook`: the round being gathered (:class:`RoundState`), its record (the round's line of
  ``metrics.jsonl``), evaluations carried by the next round's fit replies (a *pending* round), byte totals,
  ``summary.json``, and the part of the checkpoint that is the run's record.

Both are held by :class:`strategies.base.FedPersStrategy`, because Flower's legacy ``Server`` talks to a
strategy only; the strategy's Flower hooks (``configure_fit``, ``aggregate_fit``, ...) call them, and a
method reads them (``self.roster``, ``self.book``) but overrides only the strategy's hooks.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING
from typing import Any, Callable, TypedDict

import numpy as np
from flwr.common import (DisconnectRes, EvaluateIns, EvaluateRes, FitIns, FitRes, GetParametersIns, GetParametersRes,
                         GetPropertiesIns, GetPropertiesRes, ReconnectIns, log)
from flwr.server import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedpers.core.errors import FedpersError
from fedpers.core.federation import Federation
from fedpers.core.progress import format_round_line
from fedpers.core.results import (ACCURACY_PREFIXES, VALIDATION_PREFIX, ResultsWriter, accuracy_summary,
                                  machine_environment)
from fedpers.core.schema import Config, clients_per_round, pool_size, pooled
from fedpers.core.seeds import EVALUATION_SAMPLE, derived_seed
from fedpers.core.wire import PARTITION_ID, carried_evaluation_of, for_partition
from strategies.refusals import note_duplicate_partition, note_refusal, require_trained_partitions

PERSONAL_ACC_PREFIX = "acc_"  # extra client metrics "acc_<name>" become "personalized_macro_acc_<name>"


class RoundState(TypedDict, total=False):
    """What a strategy gathers during one round for its record (``RoundBook.current``): reset by
    :meth:`RoundBook.start` (configure_fit), turned into the round's line of metrics.jsonl by
    :meth:`RoundBook.finish`, and checkpointed as it is while the round is pending (so: JSON-serializable
    values). A method keeps its own per-round values in ``method`` (:meth:`RoundBook.values`), never as
    keys of their own here."""

    start: float  # perf_counter at configure_fit
    end: float  # perf_counter when the evaluate phase ended (pending rounds)
    bytes_up: int
    bytes_down: int  # broadcasts actually sent: fit, evaluate, JDFL discovery
    losses: list  # (train loss, samples) of each valid update
    rejected: int  # updates refused by validation
    failures: int  # fit and evaluate failures
    fit_clients: list  # partition ids sampled for fit
    fit_nodes: dict  # partition id (str) -> node that trained it
    global_acc: float | None  # central evaluation of the shared model
    per_client_from_global: dict  # personalized_is_global: partition id -> accuracy read off that evaluation
    eval_counts: dict  # partition id -> test samples
    evaluations: list  # (loss, examples, metrics) of each evaluate reply, sent or carried
    deferred: list  # partition ids whose evaluation comes with the next round's fit replies
    extras: dict  # method metrics of the round, copied into the record
    method: dict  # a method's own per-round values by its own names, for its own use (FedEAGD's fit sizes)


class PartitionProxy(ClientProxy):
    """Client ``partition_id`` of a pooled run (``client_layout=pool``): every message goes to one node of
    the pool (``node``) and names the partition it is for (:func:`fedpers.core.wire.for_partition`); a
    reply must name the same partition (the client's ``partition_id`` metric), else it is a failure of
    this client, not an update of another one."""

    def __init__(self, node: ClientProxy, partition_id: int):
        super().__init__(pool_client_id(partition_id))
        self.node = node
        self.partition_id = int(partition_id)

    def _checked(self, metrics: dict[str, Any], what: str) -> None:
        answered = metrics.get(PARTITION_ID)
        if answered is None or int(answered) != self.partition_id:
            raise FedpersError(f"client {self.partition_id}: the {what} reply of pool node {self.node.cid} is "
                               f"for partition {answered}")

    def get_properties(self, ins: GetPropertiesIns, timeout, group_id) -> GetPropertiesRes:
        """The client's properties (its partition id), from a node of the pool."""
        res = self.node.get_properties(GetPropertiesIns(for_partition(ins.config, self.partition_id)), timeout, group_id)
        self._checked(dict(res.properties), "properties")
        return res

    def get_parameters(self, ins: GetParametersIns, timeout, group_id) -> GetParametersRes:
        """The client's parameters, from a node of the pool."""
        return self.node.get_parameters(GetParametersIns(for_partition(ins.config, self.partition_id)), timeout,
                                        group_id)

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:
        """One local training round of this client, run by a node of the pool."""
        res = self.node.fit(FitIns(ins.parameters, for_partition(ins.config, self.partition_id)), timeout, group_id)
        self._checked(dict(res.metrics), "fit")
        return res

    def evaluate(self, ins: EvaluateIns, timeout, group_id) -> EvaluateRes:
        """This client's personalized evaluation, run by a node of the pool."""
        res = self.node.evaluate(EvaluateIns(ins.parameters, for_partition(ins.config, self.partition_id)), timeout,
                                 group_id)
        self._checked(dict(res.metrics), "evaluate")
        return res

    def reconnect(self, ins: ReconnectIns, timeout, group_id) -> DisconnectRes:
        """A pooled client holds no connection of its own: its node stays."""
        return DisconnectRes(reason="pooled client")


def pool_client_id(partition_id: int) -> str:
    """The client id of partition ``partition_id`` in a pooled run (not a Flower node id: several clients
    share a node)."""
    return f"partition-{int(partition_id)}"


class PooledClients(dict):
    """partition id -> :class:`PartitionProxy` of a pooled run, each made when first asked for: a run of
    100,000 clients makes proxies only for the clients it samples. Partition ``p`` is served by node
    ``p mod P`` of the ``P`` pool nodes (by node id), so the clients of a round spread over the pool."""

    def __init__(self, nodes: list[ClientProxy], num_clients: int, partition_of: dict[str, int]):
        super().__init__()
        self.nodes, self.num_clients, self.partition_of = nodes, num_clients, partition_of

    def __missing__(self, pid: int) -> PartitionProxy:
        if not isinstance(pid, (int, np.integer)) or not 0 <= pid < self.num_clients:
            raise KeyError(pid)
        proxy = PartitionProxy(self.nodes[int(pid) % len(self.nodes)], int(pid))
        self[int(pid)] = proxy
        self.partition_of[proxy.cid] = int(pid)
        return proxy

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, (int, np.integer)) and 0 <= int(pid) < self.num_clients

    def __len__(self) -> int:
        return self.num_clients

    def __iter__(self):
        return iter(range(self.num_clients))

    def keys(self):  # noqa: D102 - every partition, made on demand
        return range(self.num_clients)

    def items(self):  # noqa: D102 - every partition's proxy (made now: JDFL's discovery asks every client)
        return ((pid, self[pid]) for pid in range(self.num_clients))


class ClientRoster:
    """The run's clients as the server sees them: Flower node id -> partition id, and the seeded draws of
    which partitions train and which are evaluated in a round."""

    def __init__(self, cfg: Config, federation: Federation):
        self.cfg = cfg
        self.federation = federation
        self.partition_of: dict[str, int] = {}  # Flower node id (pooled: pool_client_id) -> partition id
        self._pooled: PooledClients | None = None
        self._drawn: tuple[int, set[int]] = (0, set())  # (round, partitions drawn for fit up to it)

    def proxies(self, client_manager: ClientManager, server_round: int,
                round_state: dict[str, Any] | None = None) -> dict[int, ClientProxy]:
        """Map partition id -> ClientProxy, asking each newly seen node its partition id once (in parallel).
        A pooled run (``client_layout=pool``) asks nothing: every client is a :class:`PartitionProxy` on a
        node of the pool, made when first used (:class:`PooledClients`).

        Waits for all ``num_clients`` nodes before the first round only. Later rounds use the nodes that
        are connected: a lost node's partition is skipped (deployment), a node that (re)joins is asked. A
        node that refuses the run (it does not fit it) is noted in ``round_state``
        (:func:`strategies.refusals.note_refusal`) and asked again next time; so is a node reporting a
        partition id that a connected node already holds (:func:`strategies.refusals.note_duplicate_partition`):
        the holder keeps it, and the newcomer gets it once the holder is gone.
        """
        if pooled(self.cfg):
            return self._pool(client_manager)
        if not self.partition_of:
            client_manager.wait_for(self.federation.num_clients)
        nodes = client_manager.all()
        new = [(cid, proxy) for cid, proxy in nodes.items() if cid not in self.partition_of]
        if new:
            timeout = self.cfg.round_timeout or None
            with ThreadPoolExecutor(max_workers=min(16, len(new))) as pool:
                futures = {cid: pool.submit(proxy.get_properties, GetPropertiesIns(config={}), timeout=timeout,
                                            group_id=server_round) for cid, proxy in new}
            for cid, future in futures.items():
                try:
                    pid = int(future.result().properties["partition_id"])
                except Exception as exc:  # a node lost before answering: retried when seen again
                    if note_refusal({} if round_state is None else round_state, server_round, cid, exc):
                        continue  # it does not fit this run
                    log(WARNING, "round %d: node %s did not report its partition id: %s", server_round, cid, exc)
                    continue
                if not 0 <= pid < self.federation.num_clients:
                    raise FedpersError(f"node {cid} reports partition-id {pid}, outside 0..{self.federation.num_clients - 1}")
                holder = next((other for other in nodes if other != cid and self.partition_of.get(other) == pid), None)
                if holder is not None:
                    note_duplicate_partition({} if round_state is None else round_state, server_round, cid, pid,
                                             holder)
                    continue  # asked again next round: the partition is its own once the holder is gone
                self.partition_of[cid] = pid
        proxies: dict[int, ClientProxy] = {}
        for cid, proxy in nodes.items():
            if cid in self.partition_of:
                proxies[self.partition_of[cid]] = proxy
        return proxies

    def _pool(self, client_manager: ClientManager) -> PooledClients:
        """The pooled run's clients: its nodes (every node the engine started, waited for once) in node-id
        order, so that which node serves which partition is the same in every run."""
        if self._pooled is None:
            client_manager.wait_for(pool_size(self.cfg))
            nodes = [proxy for _, proxy in sorted(client_manager.all().items())]
            self._pooled = PooledClients(nodes, self.federation.num_clients, self.partition_of)
        return self._pooled

    def fit_sample(self, server_round: int, proxies: dict[int, ClientProxy]) -> list[int]:
        """The partition ids that train in ``server_round``: ``round(fraction_fit * K)`` drawn with an RNG
        seeded by (seed, round), less those not connected."""
        return [p for p in self.fit_draw(server_round) if p in proxies]

    def fit_draw(self, server_round: int) -> list[int]:
        """The seeded draw of ``server_round``'s fit sample, sorted, before any is left out for not being
        connected: ``round(fraction_fit * K)`` partition ids from an RNG seeded by (seed, round)."""
        k = self.federation.num_clients
        m = clients_per_round(self.cfg.fraction_fit, k)
        rng = np.random.default_rng([self.cfg.seed, server_round])
        return [int(p) for p in sorted(rng.choice(k, size=m, replace=False))]

    def evaluation_sample(self, server_round: int) -> set[int] | None:
        """The partition ids evaluated in ``server_round`` with ``eval_clients`` set (None: every client):
        drawn from (seed, EVALUATION_SAMPLE, round) alone, so every method of a sweep at one seed evaluates
        the same clients and their per-client comparisons stay paired."""
        k, m = self.federation.num_clients, self.cfg.eval_clients
        rng = np.random.default_rng(derived_seed(self.cfg.seed, EVALUATION_SAMPLE, server_round))
        if self.cfg.eval_among == "trained":
            trained = self.drawn_for_fit_by(server_round)
            if m <= 0 or m >= len(trained):
                return set(trained)
            return {int(trained[i]) for i in rng.choice(len(trained), size=m, replace=False)}
        if m <= 0 or m >= k:
            return None
        return {int(p) for p in rng.choice(k, size=m, replace=False)}

    def drawn_for_fit_by(self, server_round: int) -> list[int]:
        """The partition ids drawn for fit in rounds 1..``server_round`` (:meth:`fit_draw`, connected or
        not), sorted: the same for every method at one seed, so a sample drawn from them keeps
        comparisons paired."""
        start, drawn = self._drawn if self._drawn[0] <= server_round else (0, set())
        for r in range(start + 1, server_round + 1):
            drawn.update(self.fit_draw(r))
        self._drawn = (server_round, drawn)
        return sorted(drawn)

    def max_samples(self, pid: Any) -> int | None:
        """Largest plausible sample count of an update: the config bound, else the client's train size."""
        if self.cfg.max_update_samples > 0:
            return self.cfg.max_update_samples
        return len(self.federation.partition.train[pid]) if isinstance(pid, int) else None

    def in_partition_order(self, results: list[tuple[ClientProxy, Any]]) -> list[tuple[ClientProxy, Any]]:
        """``results`` sorted by partition id (nodes without one last, by node id): the round loop hands
        replies over in completion order, and float sums over clients must not depend on which finished
        first, so every engine aggregates the same numbers in the same order."""
        def key(pair: tuple[ClientProxy, Any]) -> tuple[int, int, str]:
            pid = self.partition_of.get(pair[0].cid)
            return (0, pid, "") if isinstance(pid, int) else (1, 0, str(pair[0].cid))

        return sorted(results, key=key)


class RoundBook:
    """The run's record, round by round: the round being gathered (``current``), the finished rounds
    (``history``, each also appended to ``metrics.jsonl``), a round whose evaluations wait for the next
    round's fit replies (``pending``), byte totals, the digests of the clients' state after their last fit,
    and ``summary.json`` at the end.

    ``checkpoint`` (called after every finished or pending round when ``checkpoint_dir`` is set) and
    ``summary_extras`` come from the strategy that holds the book."""

    def __init__(self, cfg: Config, federation: Federation, writer: ResultsWriter | None, *,
                 checkpoint: Callable[[], None], summary_extras: Callable[[], dict[str, Any]], metric: str):
        self.cfg = cfg
        self.federation = federation
        self.writer = writer
        self.metric = metric
        self._checkpoint = checkpoint
        self._summary_extras = summary_extras
        self.history: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.totals = {"bytes_up": 0, "bytes_down": 0}
        self.last_fit_digest: dict[int, str] = {}  # partition id -> digest of its state after its last fit
        # partitions sampled for a fit in any round, and those that answered one (a valid or a rejected
        # update): a partition in the first set only never trained, which fails the run at its end
        self.fit_sampled: set[int] = set()
        self.fit_answered: set[int] = set()
        self.current: RoundState = {}
        # a round whose evaluation waits for the next round's fit replies: {"round": t, "state": its RoundState}
        self.pending: dict[str, Any] | None = None

    # --- the round being gathered -----------------------------------------------------------------------
    def start(self) -> None:
        """Reset the per-round counters (called by configure_fit)."""
        self.current = {"start": time.perf_counter(), "bytes_up": 0, "bytes_down": 0, "losses": [],
                        "rejected": 0, "failures": 0, "fit_clients": [], "fit_nodes": {}}

    def values(self) -> dict[str, Any]:
        """The method's own values of the current round (``RoundState.method``), reset with the round and
        checkpointed with it while it is pending."""
        return self.current.setdefault("method", {})

    def extras(self) -> dict[str, Any]:
        """The method metrics of the current round (``RoundState.extras``), copied into its record."""
        return self.current.setdefault("extras", {})

    def is_eval_round(self, server_round: int) -> bool:
        """Whether ``server_round`` evaluates: every ``eval_every`` rounds and the last round."""
        return server_round > 0 and (server_round % self.cfg.eval_every == 0 or server_round == self.cfg.rounds)

    # --- evaluations carried by the next round's fit messages ---------------------------------------
    def end_evaluation(self, server_round: int, finish: Callable[..., None]) -> None:
        """The round's evaluate phase is over: write its record (through ``finish``, the strategy's
        ``finish_round``), or, while evaluations are still to come with the next round's fit replies, keep
        it pending (checkpointed, so a resume asks for them again)."""
        if not self.current.get("deferred"):
            self.record_evaluations(server_round, finish)
            return
        self.current["end"] = time.perf_counter()
        self.pending = {"round": server_round, "state": self.current}
        if self.cfg.checkpoint_dir:
            self._checkpoint()

    def complete_pending(self, results: list[tuple[ClientProxy, Any]], finish: Callable[..., None]) -> None:
        """Write the pending round's record with the evaluations these fit replies carry."""
        pending, self.pending = self.pending, None
        state = pending["state"]
        deferred = set(state["deferred"])
        carried = set()
        for _, res in results:
            evaluation = carried_evaluation_of(res.metrics)
            if evaluation is not None and int(evaluation[2].get("partition_id", -1)) in deferred - carried:
                carried.add(int(evaluation[2]["partition_id"]))
                state["evaluations"].append(evaluation)
        if deferred - carried:
            log(WARNING, "round %d: no evaluation came with the round %d fit replies of clients %s (lost or failed)",
                pending["round"], pending["round"] + 1, sorted(deferred - carried))
        current, self.current = self.current, state  # a method's finish_round reads its round's counters
        try:
            self.record_evaluations(int(pending["round"]), finish)
        finally:
            self.current = current

    def record_evaluations(self, server_round: int, finish: Callable[..., None]) -> None:
        """The round's record from its clients' evaluations (``current["evaluations"]``: loss, examples,
        metrics of each evaluate reply, in or carried), handed to ``finish(round, per_client, extras)``."""
        per_client: dict[int, float] = {}
        per_client_val: dict[int, float] = {}
        extras: dict[str, dict[int, float]] = {}
        consistent = True
        for _, examples, m in sorted(self.current.get("evaluations", []), key=lambda e: int(e[2]["partition_id"])):
            pid = int(m["partition_id"])
            per_client[pid] = float(m["acc"])
            if VALIDATION_PREFIX + "acc" in m:
                per_client_val[pid] = float(m[VALIDATION_PREFIX + "acc"])
            self.current.setdefault("eval_counts", {})[pid] = int(examples)
            for key, value in m.items():
                # "acc_<name>" and, on the validation split, "val_acc_<name>"
                for prefix in (PERSONAL_ACC_PREFIX, VALIDATION_PREFIX + PERSONAL_ACC_PREFIX):
                    if key.startswith(prefix):
                        extras.setdefault(key[: len(prefix) - len(PERSONAL_ACC_PREFIX)] + "personalized_macro_acc_"
                                          + key[len(prefix):], {})[pid] = float(value)
            if pid in self.last_fit_digest and "state_digest" in m:
                consistent &= self.last_fit_digest[pid] == str(m["state_digest"])
        record_extras: dict[str, Any] = {name: mean_of(vals.values()) for name, vals in extras.items()}
        # and each client's value behind it (per_client_acc_fair, ...), for comparisons paired per client
        record_extras.update({name.replace("personalized_macro_acc", "per_client_acc"):
                              {str(k): v for k, v in sorted(vals.items())} for name, vals in extras.items()})
        if per_client_val:
            # the validation split's figures (config key val_fraction): values are chosen on these
            record_extras[VALIDATION_PREFIX + "personalized_macro_acc"] = mean_of(per_client_val.values())
            record_extras[VALIDATION_PREFIX + "per_client_acc"] = {str(k): v for k, v in sorted(per_client_val.items())}
        record_extras["client_state_consistent"] = consistent
        finish(server_round, per_client, record_extras)

    # --- a finished round ----------------------------------------------------------------------------
    def finish(self, server_round: int, per_client: dict[int, float] | None, extras: dict[str, Any]) -> None:
        """Write the round's record (``current`` with ``per_client`` accuracies and ``extras``): history,
        metrics.jsonl, checkpoint, the progress line, and ``summary.json`` after the last round."""
        r = self.current
        losses = r.get("losses", [])
        n = sum(c for _, c in losses)
        record: dict[str, Any] = {
            "round": server_round,
            "global_acc": r.get("global_acc"),
            "personalized_macro_acc": mean_of(per_client.values()) if per_client else None,
            "personalized_weighted_acc": weighted_mean(per_client, r.get("eval_counts", {})) if per_client else None,
            "per_client_acc": {str(k): v for k, v in sorted(per_client.items())} if per_client else None,
            "evaluated_clients": len(per_client) if per_client else 0,
            "train_loss": sum(l * c for l, c in losses) / n if n else None,
            "bytes_up": r.get("bytes_up", 0),
            "bytes_down": r.get("bytes_down", 0),
            "round_seconds": r.get("end", time.perf_counter()) - r.get("start", time.perf_counter()),
            "fit_clients": r.get("fit_clients", []),
            "fit_nodes": r.get("fit_nodes", {}),  # partition id -> node that trained it (Ray node id / host)
            "rejected_updates": r.get("rejected", 0),
            "failed_clients": r.get("failures", 0),
            **r.get("extras", {}),  # method metrics of the round (e.g. JDFL's per-domain accuracy)
            **extras,
        }
        self.totals["bytes_up"] += record["bytes_up"]
        self.totals["bytes_down"] += record["bytes_down"]
        self.history.append(record)
        if self.writer is not None:
            self.writer.append_round(record)
        if self.cfg.checkpoint_dir:
            self._checkpoint()
        elapsed = time.perf_counter() - self.started
        print(format_round_line(record, self.cfg.rounds, elapsed), flush=True)
        if server_round == self.cfg.rounds:
            self.write_summary()

    def write_summary(self) -> None:
        """``summary.json`` (and the curves) from the finished rounds: after the last round, or at once when
        a resumed run has nothing left to run; a FedpersError instead when a sampled partition never trained
        (:func:`strategies.refusals.require_trained_partitions`)."""
        require_trained_partitions(self.fit_sampled, self.fit_answered, self.cfg.rounds)
        last = self.history[-1]
        final = {k: v for k, v in last.items() if k.startswith(ACCURACY_PREFIXES)}
        summary = {
            "method": self.cfg.method,
            "dataset": self.cfg.dataset,
            "rounds": self.cfg.rounds,
            "metric": self.metric,
            "final": final,
            **accuracy_summary(self.history),  # best (and its round) and mean of the last evaluated rounds
            "client_label_counts": self.federation.client_label_counts(),
            "wall_seconds": time.perf_counter() - self.started,
            "mean_round_seconds": mean_of(h["round_seconds"] for h in self.history),
            "bytes_up": self.totals["bytes_up"],
            "bytes_down": self.totals["bytes_down"],
            "num_clients": self.federation.num_clients,
            "client_train_sizes": [len(t) for t in self.federation.partition.train],
            # share of each client's training samples held out as its validation split (0: none), and
            # how many samples that is per client
            "val_fraction": self.cfg.val_fraction,
            # clients evaluated per evaluation round when a sample (eval_clients), else None: every client
            "evaluation_sample": (self.cfg.eval_clients
                                  if 0 < self.cfg.eval_clients < self.federation.num_clients else None),
            # "trained": the evaluated clients were drawn among those drawn for fit so far (eval_among)
            "evaluated_among": self.cfg.eval_among,
            "client_val_sizes": [len(v) for v in self.federation.partition.val or ()],
            "aux_size": len(self.federation.partition.aux),
            "config": self.cfg.to_dict(),
            # the machine of the process that writes this file (the server; in a simulation the clients'
            # too; a run resumed elsewhere names the last one): runs that differ only in their last digits
            # can be told apart by it
            "environment": machine_environment(),
            **self._summary_extras(),
        }
        if self.writer is not None:
            self.writer.write_summary(summary, self.history)
        log(INFO, "fedpers: %s final %s = %s", self.cfg.method, self.metric, final.get(self.metric))

    # --- checkpoint / resume (fedpers/core/checkpoint.py) --------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The record's part of a checkpoint: the last finished (or pending) round, the pending round,
        history, totals, the clients' last fit digests and the elapsed time."""
        done = self.history[-1]["round"] if self.history else 0
        return {
            "round": max(done, self.pending["round"]) if self.pending else done,
            "pending": self.pending,
            "history": list(self.history),
            "totals": dict(self.totals),
            "last_fit_digest": {str(k): v for k, v in self.last_fit_digest.items()},
            "fit_sampled": sorted(self.fit_sampled),
            "fit_answered": sorted(self.fit_answered),
            "elapsed": time.perf_counter() - self.started,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the writer, if any, gets the finished rounds again)."""
        self.history = list(state.get("history", []))
        self.totals = {"bytes_up": 0, "bytes_down": 0, **state.get("totals", {})}
        self.last_fit_digest = {int(k): str(v) for k, v in state.get("last_fit_digest", {}).items()}
        # a checkpoint written before these were kept: every partition its rounds sampled counts as trained
        sampled = {int(p) for record in self.history for p in record.get("fit_clients", [])}
        self.fit_sampled = {int(p) for p in state.get("fit_sampled", sampled)}
        self.fit_answered = {int(p) for p in state.get("fit_answered", sampled)}
        self.started = time.perf_counter() - float(state.get("elapsed", 0.0))
        self.pending = state.get("pending") or None
        if self.writer is not None:
            for record in self.history:
                self.writer.append_round(record)


def weighted_mean(per_client: dict[int, float], counts: dict[int, int]) -> float | None:
    """Sample-weighted personalized accuracy (PFLlib's and FL-bench's): the sum over clients of correct
    test predictions over the sum of test samples, i.e. ``sum_k n_k acc_k / sum_k n_k``."""
    pairs = [(acc, counts[pid]) for pid, acc in per_client.items()
             if acc is not None and math.isfinite(acc) and counts.get(pid)]
    total = sum(n for _, n in pairs)
    return float(sum(a * n for a, n in pairs) / total) if total else None


def mean_of(values) -> float | None:
    """The mean of the finite values (None where there is none): a round's macro accuracy over clients."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(vals)) if vals else None
