"""Shared server side of every fedpers method: a Flower ``Strategy`` (the public legacy API) that

* samples clients reproducibly by partition id (seeded per round),
* validates every update (count, shapes, dtype, finiteness, sample count) and drops bad ones with a log
  line naming the client,
* aggregates the uploaded part by sample-weighted averaging,
* evaluates the shared model centrally on the whole test set and every client's personalized model on
  its own test split, every ``eval_every`` rounds and at the last round,
* counts the bytes of the arrays actually sent each way, and writes ``metrics.jsonl``/``summary.json``.

With ``evaluate_with_next_fit`` a client sampled again in round t + 1 gets round t's evaluation in that
fit message (``fedpers.core.wire.EVALUATE_ROUND``) instead of an evaluate message: round t then ends *pending*
(checkpointed with the evaluations it has), and its record is written once round t + 1's fit replies
bring the rest (:meth:`FedPersStrategy.aggregate_fit`). The last round always evaluates everyone itself.

A method subclass says which part of the model is broadcast (``download_part``) and uploaded
(``upload_part``) and may override :meth:`prepare_global_model` and :meth:`apply_aggregate`.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING
from typing import Any, NamedTuple, TypedDict

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedpers.core.errors import FedpersError
from fedpers.core.federation import Federation
from fedpers.core.models import Part, array_shapes, build_model, get_arrays, set_arrays
from fedpers.core.progress import format_round_line
from fedpers.core.results import ACCURACY_PREFIXES, VALIDATION_PREFIX, ResultsWriter, accuracy_summary
from fedpers.core.schema import Config
from fedpers.core.seeds import EVALUATION_SAMPLE, derived_seed
from fedpers.core.training import accuracy_and_loss, predict_logits, resolve_device
from fedpers.core.validation import aggregate_updates, update_problem
from fedpers.core.wire import (MODEL_SECTION, WHOLE_MODEL, Contract, ContractSide, SectionError, carried_evaluation_of,
                          join_sections, round_config, split_sections, with_evaluation)
from strategies.refusals import note_refusal, require_fitting_nodes  # issue 30: nodes that do not fit the run


class Upload(NamedTuple):
    """One validated client upload: its model section, its sample count and its other named sections."""

    model: list[np.ndarray]  # the upload's "model" section (upload_part of the client's model; [] if none)
    num_examples: int
    sections: dict[str, list[np.ndarray]]  # the other sections by name (SCAFFOLD's "control_delta", ...)


# The validated uploads of a round: partition id -> its Upload, in arrival order.
Updates = dict[int, Upload]


class RoundState(TypedDict, total=False):
    """What a strategy gathers during one round for its record (``FedPersStrategy._round``): reset by
    ``start_round`` (configure_fit), turned into the round's line of metrics.jsonl by ``_finish_round``,
    and checkpointed as it is while the round is pending (so: JSON-serializable values). A method keeps its own
    per-round values in ``method`` (:meth:`FedPersStrategy.round_values`), never as keys of their own here."""

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
PERSONAL_ACC_PREFIX = "acc_"  # extra client metrics "acc_<name>" become "personalized_macro_acc_<name>"


def parameters_nbytes(parameters: Parameters) -> int:
    """Bytes of the serialized arrays in ``parameters`` (what actually travels)."""
    return sum(len(t) for t in parameters.tensors)


class FedPersStrategy(ContractSide, Strategy):
    """Base strategy: see module docstring."""

    # what the server broadcasts and each client uploads (model parts, named sections; read as
    # download_part, upload_part, ...): one fedpers.core.wire.Contract, named by the method's strategy and client
    contract: Contract = WHOLE_MODEL
    has_global_model: bool = True
    # True where every client's personalized model *is* the global model (FedAvg and the global optimizers
    # built on it): the per-client accuracies are then read off the server's one evaluation of the global
    # model on the union of the clients' test splits, instead of each client repeating that forward pass
    # on its own slice of it (no evaluate messages are sent).
    personalized_is_global: bool = False
    metric: str = "personalized_macro_acc"  # the headline metric of summary.json (FedAvg's family: global_acc)
    model_kind: str = "cnn"  # fedpers.core.models.build_model kind, unless cfg.model_kind says otherwise
    # False where a fit message's broadcast is not the evaluate message's (per-client fit broadcasts:
    # pFedSim, FedFed): those clients cannot run round t's evaluation on round t + 1's fit broadcast
    fit_carries_evaluation: bool = True

    def __init__(self, cfg: Config, federation: Federation, writer: ResultsWriter | None = None):
        self.cfg = cfg
        self.federation = federation
        self.writer = writer
        self.device = resolve_device(cfg.device)
        self.model = build_model(federation.input_shape, federation.num_classes, feature_dim=cfg.feature_dim,
                                 dropout=cfg.dropout, seed=cfg.seed, kind=cfg.model_kind or self.model_kind).to(self.device)
        self.upload_shapes = array_shapes(self.model, self.upload_part)
        self.partition_of: dict[str, int] = {}  # Flower node id -> partition id
        self.last_fit_digest: dict[int, str] = {}  # partition id -> digest of its state after its last fit
        self.history: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.totals = {"bytes_up": 0, "bytes_down": 0}
        self._round: RoundState = {}
        # a round whose evaluation waits for the next round's fit replies: {"round": t, "state": its RoundState}
        self._pending: dict[str, Any] | None = None
        self._broadcast_counts: dict[str, int] | None = None  # the section counts of the last download_arrays()
        self.prepare_global_model()

    # --- hooks for methods --------------------------------------------------------------------
    def prepare_global_model(self) -> None:
        """Server-side work before round 1 (e.g. pFedKDH warm-up and teacher calibration)."""

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install the aggregated upload part in the global model (methods add server-side steps)."""
        set_arrays(self.model, aggregated, self.upload_part, source="aggregate")

    def aggregate(self, server_round: int, updates: Updates) -> list[np.ndarray]:
        """Aggregate the validated updates, keyed by the partition id that sent them (default:
        ``aggregate_updates`` with the config's rule); methods that upload server state next to the model
        (SCAFFOLD, FedDC, FedProc) aggregate it here, per-client methods (pFedSim) keep them by client."""
        return aggregate_updates(self.model_updates(updates), self.cfg.aggregation, self.cfg.trim_fraction)

    @staticmethod
    def model_updates(updates: Updates) -> list[tuple[list[np.ndarray], int]]:
        """(model section, sample count) of each validated upload, in arrival order."""
        return [(u.model, u.num_examples) for u in updates.values()]

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The shapes every upload's sections must have, by name (default: the model section's); a section
        left out has shapes that vary (FedFed's shared features) and is checked by the method."""
        return {MODEL_SECTION: self.upload_shapes}

    def summary_extras(self) -> dict[str, Any]:
        """Method-specific fields added to ``summary.json`` (default: none)."""
        return {}

    def reset_model_state(self) -> None:
        """Rebuild what depends on the model's shapes after they changed (JDFL's head expansion, before
        any training): the expected upload shapes; methods with server state (SCAFFOLD's c, FedDyn's h)
        rebuild it too."""
        self.upload_shapes = array_shapes(self.model, self.upload_part)

    def broadcast_content(self) -> dict[str, list[np.ndarray]]:
        """The broadcast's sections by name (default: the model's ``download_part``)."""
        return {MODEL_SECTION: get_arrays(self.model, self.download_part)}

    def download_arrays(self) -> list[np.ndarray]:
        """Arrays broadcast to clients (:meth:`broadcast_content` in the declared section order); the
        counts of its sections go in every message's config (:meth:`message_config`)."""
        arrays, self._broadcast_counts = join_sections(self.broadcast_content(), self.broadcast_sections)
        return arrays

    def message_config(self, server_round: int, **extra: Any) -> dict[str, Any]:
        """The config of a fit or evaluate message of ``server_round`` that carries the current broadcast:
        the round, the counts of the broadcast's sections, and ``extra``."""
        if self._broadcast_counts is None:  # no broadcast built yet
            self.download_arrays()
        return round_config(server_round, **self._broadcast_counts, **extra)

    # --- checkpoint / resume (fedpers/core/checkpoint.py) ------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Method-specific server state to checkpoint: name -> ndarray or JSON value (default: none)."""
        return {}

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned (default: nothing to do)."""

    def state_dict(self) -> dict[str, Any]:
        """Server state after the last finished round: global model, round, history, totals, RNG."""
        import torch

        done = self.history[-1]["round"] if self.history else 0
        return {
            "round": max(done, self._pending["round"]) if self._pending else done,
            "pending": self._pending,
            "model": {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()},
            "history": list(self.history),
            "totals": dict(self.totals),
            "last_fit_digest": {str(k): v for k, v in self.last_fit_digest.items()},
            "elapsed": time.perf_counter() - self.started,
            "torch_rng": torch.get_rng_state().numpy(),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the inverse; the writer, if any, gets the finished rounds again)."""
        import torch

        tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in state["model"].items()}
        self.model.load_state_dict(tensors)
        self.history = list(state.get("history", []))
        self.totals = {"bytes_up": 0, "bytes_down": 0, **state.get("totals", {})}
        self.last_fit_digest = {int(k): str(v) for k, v in state.get("last_fit_digest", {}).items()}
        self.started = time.perf_counter() - float(state.get("elapsed", 0.0))
        if state.get("torch_rng") is not None:
            torch.set_rng_state(torch.as_tensor(np.asarray(state["torch_rng"], dtype=np.uint8)))
        self.load_extra_state(dict(state.get("extra", {})))
        self._pending = state.get("pending") or None
        if self.writer is not None:
            for record in self.history:
                self.writer.append_round(record)

    def save_checkpoint(self) -> None:
        """Write :meth:`state_dict` to ``checkpoint_dir`` atomically (called after every round)."""
        from fedpers.core.checkpoint import save_checkpoint

        save_checkpoint(self.cfg.checkpoint_dir, self.state_dict(), self.cfg)

    # --- Flower Strategy interface ----------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The initial broadcast (after :meth:`prepare_global_model`)."""
        return ndarrays_to_parameters(self.download_arrays())

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        """Sample ``round(fraction_fit * K)`` clients by partition id with a per-round seeded RNG."""
        self.start_round()
        proxies = self._proxies_by_partition(client_manager, server_round)
        chosen = self._fit_sample(server_round, proxies)
        require_fitting_nodes(self._round, server_round, len(proxies), self.federation.num_clients,  # #30
                              self.cfg.fraction_fit, self.cfg.min_fit_updates)
        self._round["fit_clients"] = chosen
        ins = FitIns(parameters, self.message_config(server_round))
        self._round["bytes_down"] += parameters_nbytes(parameters) * len(chosen)
        if self._pending is None:
            return [(proxies[p], ins) for p in chosen]
        carrying = FitIns(parameters, with_evaluation(ins.config, self._pending["round"]))
        deferred = set(self._pending["state"]["deferred"])
        return [(proxies[p], carrying if p in deferred else ins) for p in chosen]

    def per_client_fit(self, pairs: list[tuple[ClientProxy, FitIns]],
                       content_for) -> list[tuple[ClientProxy, FitIns]]:
        """Replace each sampled client's FitIns by one carrying the sections ``content_for(partition_id)``
        (same config, their own counts), and count the round's ``bytes_down`` as the sum of what is
        actually sent (pFedSim, FedFed)."""
        if self.fit_carries_evaluation:
            raise FedpersError(f"{type(self).__name__}: per-client fit broadcasts need fit_carries_evaluation = "
                               "False (a carried evaluation would run on another model than the evaluate broadcast)")
        out = []
        sent = 0
        for proxy, ins in pairs:
            arrays, counts = join_sections(content_for(self.partition_of[proxy.cid]), self.broadcast_sections)
            params = ndarrays_to_parameters(arrays)
            sent += parameters_nbytes(params)
            out.append((proxy, FitIns(params, {**ins.config, **counts})))
        self._round["bytes_down"] = sent
        return out

    def evaluation_sample(self, server_round: int) -> set[int] | None:
        """The partition ids evaluated in ``server_round`` with ``eval_clients`` set (None: every client):
        drawn from (seed, EVALUATION_SAMPLE, round) alone, so every method of a sweep at one seed evaluates
        the same clients and their per-client comparisons stay paired."""
        k, m = self.federation.num_clients, self.cfg.eval_clients
        if m <= 0 or m >= k:
            return None
        rng = np.random.default_rng(derived_seed(self.cfg.seed, EVALUATION_SAMPLE, server_round))
        return {int(p) for p in rng.choice(k, size=m, replace=False)}

    def _fit_sample(self, server_round: int, proxies: dict[int, ClientProxy]) -> list[int]:
        """The partition ids that train in ``server_round``: ``round(fraction_fit * K)`` drawn with an RNG
        seeded by (seed, round), less those not connected."""
        k = self.federation.num_clients
        m = max(1, int(round(self.cfg.fraction_fit * k)))
        rng = np.random.default_rng([self.cfg.seed, server_round])
        return [int(p) for p in sorted(rng.choice(k, size=m, replace=False)) if int(p) in proxies]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Validate every update, drop the bad ones (logged), and aggregate the rest; first, the record of a
        pending previous round with the evaluations these replies carry."""
        if self._pending is not None:
            self._complete_pending(results)
        valid: Updates = {}
        for proxy, res in results:
            self._round["bytes_up"] += parameters_nbytes(res.parameters)
            pid = self.partition_of.get(proxy.cid, "?")
            sections, problem = self._upload_of(res, pid)
            if not problem and (not isinstance(pid, int) or pid in valid):
                problem = "no partition id for this node" if not isinstance(pid, int) else "a second update this round"
            if problem:
                self._round["rejected"] += 1
                log(WARNING, "round %d: rejected update from client %s (node %s): %s",
                    server_round, pid, proxy.cid, problem)
                continue
            valid[pid] = Upload(sections.pop(MODEL_SECTION, []), int(res.num_examples), sections)
            if "node" in res.metrics:
                self._round["fit_nodes"][str(pid)] = str(res.metrics["node"])
            loss = res.metrics.get("train_loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                self._round["losses"].append((float(loss), int(res.num_examples)))
            if "state_digest" in res.metrics:
                self.last_fit_digest[pid] = str(res.metrics["state_digest"])
        for failure in failures:
            self._round["failures"] += 1
            log(WARNING, "round %d: a client failed during fit: %s", server_round, _describe_failure(failure))
        if len(valid) < self.cfg.min_fit_updates:
            raise FedpersError(
                f"round {server_round}: {len(valid)} valid client updates, fewer than min_fit_updates="
                f"{self.cfg.min_fit_updates} ({self._round['rejected']} rejected, {self._round['failures']} failed)"
            )
        self.apply_aggregate(server_round, self.aggregate(server_round, valid))
        return ndarrays_to_parameters(self.download_arrays()), {}

    def _upload_of(self, res: FitRes, pid: Any) -> tuple[dict[str, list[np.ndarray]], str | None]:
        """A fit reply's sections by name and why it must not be aggregated (None when it may): undecodable,
        not the declared sections, or a section of fixed shapes with a wrong one (or non-finite values)."""
        try:
            arrays = parameters_to_ndarrays(res.parameters)
        except Exception as exc:  # undecodable payload
            return {}, f"undecodable arrays ({type(exc).__name__})"
        try:
            sections = split_sections(arrays, res.metrics, self.upload_sections)
        except SectionError as exc:
            return {}, str(exc)
        for name, shapes in self.upload_section_shapes().items():
            problem = update_problem(sections[name], shapes, res.num_examples, self._max_samples(pid))
            if problem:
                return {}, problem if name == MODEL_SECTION and len(sections) == 1 else f"section '{name}': {problem}"
        return sections, None

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Global accuracy of the shared model on the whole test set (methods with a global model)."""
        if server_round == 0 or not self.has_global_model or not self._is_eval_round(server_round):
            self._round["global_acc"] = None
            return None
        test = self.federation.test(self.device)
        logits = predict_logits(self.model, test.x)
        acc, loss = accuracy_and_loss(logits, test.y)
        self._round["global_acc"] = acc
        if self.personalized_is_global:
            positions = self.federation.test_positions()
            correct = (logits.argmax(dim=1) == test.y).cpu().numpy()
            # each client's accuracy: the mean over the positions of its own test split in the union
            self._round["per_client_from_global"] = {pid: float(correct[pos].mean())
                                                     for pid, pos in enumerate(positions) if len(pos)}
            self._round["eval_counts"] = {pid: len(pos) for pid, pos in enumerate(positions)}
        return loss, {"global_acc": acc}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Every client evaluates its personalized model (eval rounds only)."""
        if not self._is_eval_round(server_round):
            self._finish_round(server_round, None, {})
            return []
        sample = self.evaluation_sample(server_round)
        if self.personalized_is_global and "per_client_from_global" in self._round:
            # no client state is involved: the evaluated model is the one the server holds
            per_client = {pid: acc for pid, acc in self._round["per_client_from_global"].items()
                          if sample is None or pid in sample}
            self._finish_round(server_round, per_client, {"client_state_consistent": True})
            return []
        proxies = self._proxies_by_partition(client_manager, server_round)
        if sample is not None:
            proxies = {pid: proxy for pid, proxy in proxies.items() if pid in sample}
        deferred = set(self._fit_sample(server_round + 1, proxies)) if self._carries(server_round) else set()
        self._round["evaluations"] = []
        self._round["deferred"] = sorted(deferred)
        asked = [p for p in sorted(proxies) if p not in deferred]
        self._round["bytes_down"] += parameters_nbytes(parameters) * len(asked)
        if not asked:  # Flower calls aggregate_evaluate only after messages were sent
            self._end_evaluation(server_round)
        ins = EvaluateIns(parameters, self.message_config(server_round))
        return [(proxies[p], ins) for p in asked]

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        """Personalized macro accuracy: the mean over clients of each client's own test accuracy (the
        round's record waits for the evaluations carried by the next round's fit replies, if any)."""
        evaluations = [(float(res.loss), int(res.num_examples), dict(res.metrics)) for _, res in results]
        self._round.setdefault("evaluations", []).extend(evaluations)
        for failure in failures:
            self._round["failures"] += 1
            log(WARNING, "round %d: a client failed during evaluate: %s", server_round, _describe_failure(failure))
        self._end_evaluation(server_round)
        total = sum(n for _, n, _ in evaluations)
        loss = sum(l * n for l, n, _ in evaluations) / total if total else None
        return loss, {"personalized_macro_acc": _mean(float(m["acc"]) for _, _, m in evaluations)}

    # --- evaluations carried by the next round's fit messages ---------------------------------------
    def _carries(self, server_round: int) -> bool:
        """Whether round ``server_round``'s evaluation of the next round's clients goes with their fit."""
        return (self.cfg.evaluate_with_next_fit and self.fit_carries_evaluation
                and server_round < self.cfg.rounds)

    def _end_evaluation(self, server_round: int) -> None:
        """The round's evaluate phase is over: write its record, or, while evaluations are still to come
        with the next round's fit replies, keep it pending (checkpointed, so a resume asks for them again)."""
        if not self._round.get("deferred"):
            self._record_evaluations(server_round)
            return
        self._round["end"] = time.perf_counter()
        self._pending = {"round": server_round, "state": self._round}
        if self.cfg.checkpoint_dir:
            self.save_checkpoint()

    def _complete_pending(self, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Write the pending round's record with the evaluations these fit replies carry."""
        pending, self._pending = self._pending, None
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
        current, self._round = self._round, state  # a method's _finish_round reads its round's counters
        try:
            self._record_evaluations(int(pending["round"]))
        finally:
            self._round = current

    def _record_evaluations(self, server_round: int) -> None:
        """The round's record from its clients' evaluations (``_round["evaluations"]``: loss, examples,
        metrics of each evaluate reply, in or carried)."""
        per_client: dict[int, float] = {}
        per_client_val: dict[int, float] = {}
        extras: dict[str, dict[int, float]] = {}
        consistent = True
        for _, examples, m in sorted(self._round.get("evaluations", []), key=lambda e: int(e[2]["partition_id"])):
            pid = int(m["partition_id"])
            per_client[pid] = float(m["acc"])
            if VALIDATION_PREFIX + "acc" in m:
                per_client_val[pid] = float(m[VALIDATION_PREFIX + "acc"])
            self._round.setdefault("eval_counts", {})[pid] = int(examples)
            for key, value in m.items():
                # "acc_<name>" and, on the validation split, "val_acc_<name>"
                for prefix in (PERSONAL_ACC_PREFIX, VALIDATION_PREFIX + PERSONAL_ACC_PREFIX):
                    if key.startswith(prefix):
                        extras.setdefault(key[: len(prefix) - len(PERSONAL_ACC_PREFIX)] + "personalized_macro_acc_"
                                          + key[len(prefix):], {})[pid] = float(value)
            if pid in self.last_fit_digest and "state_digest" in m:
                consistent &= self.last_fit_digest[pid] == str(m["state_digest"])
        record_extras: dict[str, Any] = {name: _mean(vals.values()) for name, vals in extras.items()}
        # and each client's value behind it (per_client_acc_fair, ...), for comparisons paired per client
        record_extras.update({name.replace("personalized_macro_acc", "per_client_acc"):
                              {str(k): v for k, v in sorted(vals.items())} for name, vals in extras.items()})
        if per_client_val:
            # the validation split's figures (config key val_fraction): values are chosen on these
            record_extras[VALIDATION_PREFIX + "personalized_macro_acc"] = _mean(per_client_val.values())
            record_extras[VALIDATION_PREFIX + "per_client_acc"] = {str(k): v for k, v in sorted(per_client_val.items())}
        record_extras["client_state_consistent"] = consistent
        self._finish_round(server_round, per_client, record_extras)

    # --- helpers ----------------------------------------------------------------------------------
    def round_values(self) -> dict[str, Any]:
        """The method's own values of the current round (``RoundState.method``), reset with the round and
        checkpointed with it while it is pending."""
        return self._round.setdefault("method", {})

    def start_round(self) -> None:
        """Reset the per-round counters (called by configure_fit)."""
        self._round = {"start": time.perf_counter(), "bytes_up": 0, "bytes_down": 0, "losses": [],
                       "rejected": 0, "failures": 0, "fit_clients": [], "fit_nodes": {}}

    def _is_eval_round(self, server_round: int) -> bool:
        return server_round > 0 and (server_round % self.cfg.eval_every == 0 or server_round == self.cfg.rounds)

    def _max_samples(self, pid: Any) -> int | None:
        """Largest plausible sample count of an update: the config bound, else the client's train size."""
        if self.cfg.max_update_samples > 0:
            return self.cfg.max_update_samples
        return len(self.federation.partition.train[pid]) if isinstance(pid, int) else None

    def _proxies_by_partition(self, client_manager: ClientManager, server_round: int) -> dict[int, ClientProxy]:
        """Map partition id -> ClientProxy, asking each newly seen node its partition id once (in parallel).

        Waits for all ``num_clients`` nodes before the first round only. Later rounds use the nodes that
        are connected: a lost node's partition is skipped (deployment), a node that (re)joins is asked.
        """
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
                    if note_refusal(self._round, server_round, cid, exc):  # it does not fit this run (#30)
                        continue
                    log(WARNING, "round %d: node %s did not report its partition id: %s", server_round, cid, exc)
                    continue
                if not 0 <= pid < self.federation.num_clients:
                    raise FedpersError(f"node {cid} reports partition-id {pid}, outside 0..{self.federation.num_clients - 1}")
                self.partition_of[cid] = pid
        proxies: dict[int, ClientProxy] = {}
        for cid, proxy in nodes.items():
            if cid in self.partition_of:
                proxies[self.partition_of[cid]] = proxy  # a rejoined node (registered later) wins
        return proxies

    def _finish_round(self, server_round: int, per_client: dict[int, float] | None, extras: dict[str, Any]) -> None:
        r = self._round
        losses = r.get("losses", [])
        n = sum(c for _, c in losses)
        record: dict[str, Any] = {
            "round": server_round,
            "global_acc": r.get("global_acc"),
            "personalized_macro_acc": _mean(per_client.values()) if per_client else None,
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
            self.save_checkpoint()
        elapsed = time.perf_counter() - self.started
        print(format_round_line(record, self.cfg.rounds, elapsed), flush=True)
        if server_round == self.cfg.rounds:
            self.write_summary()

    def write_summary(self) -> None:
        """``summary.json`` (and the curves) from the finished rounds: after the last round, or at once when
        a resumed run has nothing left to run."""
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
            "mean_round_seconds": _mean(h["round_seconds"] for h in self.history),
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
            "client_val_sizes": [len(v) for v in self.federation.partition.val or ()],
            "aux_size": len(self.federation.partition.aux),
            "config": self.cfg.to_dict(),
            **self.summary_extras(),
        }
        if self.writer is not None:
            self.writer.write_summary(summary, self.history)
        log(INFO, "fedpers: %s final %s = %s", self.cfg.method, self.metric, final.get(self.metric))


def weighted_mean(per_client: dict[int, float], counts: dict[int, int]) -> float | None:
    """Sample-weighted personalized accuracy (PFLlib's and FL-bench's): the sum over clients of correct
    test predictions over the sum of test samples, i.e. ``sum_k n_k acc_k / sum_k n_k``."""
    pairs = [(acc, counts[pid]) for pid, acc in per_client.items()
             if acc is not None and math.isfinite(acc) and counts.get(pid)]
    total = sum(n for _, n in pairs)
    return float(sum(a * n for a, n in pairs) / total) if total else None


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def _describe_failure(failure: Any) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    if isinstance(failure, tuple) and len(failure) == 2:
        proxy, res = failure
        status = getattr(res, "status", None)
        return f"node {getattr(proxy, 'cid', '?')}: {getattr(status, 'message', res)}"
    return str(failure)
