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
(``upload_part``) and may override :meth:`prepare_global_model` and :meth:`apply_aggregate`. The round
mechanics (which node is which partition, the seeded samples, the round's record, pending rounds, totals,
summary.json) are :mod:`strategies.rounds`' ``ClientRoster`` (``self.roster``) and ``RoundBook``
(``self.book``); the strategy keeps Flower's hooks and the hooks a method overrides.
"""

from __future__ import annotations

import math
from logging import WARNING
from typing import Any, NamedTuple

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedpers.core.errors import FedpersError, refuse_if_stopping
from fedpers.core.federation import Federation
from fedpers.core.models import array_shapes, build_model, get_arrays, model_kind_for, set_arrays
from fedpers.core.results import ResultsWriter
from fedpers.core.schema import Config
from fedpers.core.training import accuracy_and_loss, predict_logits, resolve_device
from fedpers.core.validation import aggregate_updates, update_problem
from fedpers.core.wire import (MODEL_SECTION, WHOLE_MODEL, Contract, ContractSide, SectionError,
                          join_sections, round_config, split_sections, with_evaluation)
from strategies.refusals import require_fitting_nodes  # nodes that do not fit the run
from strategies.rounds import ClientRoster, RoundBook, mean_of


class Upload(NamedTuple):
    """One validated client upload: its model section, its sample count and its other named sections."""

    model: list[np.ndarray]  # the upload's "model" section (upload_part of the client's model; [] if none)
    num_examples: int
    sections: dict[str, list[np.ndarray]]  # the other sections by name (SCAFFOLD's "control_delta", ...)


# The validated uploads of a round: partition id -> its Upload, in arrival order.
Updates = dict[int, Upload]


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
        self.device = resolve_device(cfg.device)
        self.model = build_model(federation.input_shape, federation.num_classes, feature_dim=cfg.feature_dim,
                                 dropout=cfg.dropout, seed=cfg.seed,
                                 kind=model_kind_for(cfg.model_kind, self.model_kind, cfg.dataset)).to(self.device)
        self.upload_shapes = array_shapes(self.model, self.upload_part)
        self.roster = ClientRoster(cfg, federation)  # node -> partition, the seeded samples of a round
        # the run's record: the round being gathered, finished rounds, pending round, totals, summary.json
        self.book = RoundBook(cfg, federation, writer, checkpoint=self.save_checkpoint,
                              summary_extras=self.summary_extras, metric=self.metric)
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

    def configure_phase(self, server_round: int, parameters: Parameters,
                        client_manager: ClientManager) -> tuple[str, list[tuple[ClientProxy, FitIns]]] | None:
        """A phase the round loop runs before ``server_round``'s fit (default: none): its name and the fit
        messages to send (JDFL's pseudo-domain discovery before round 1)."""
        return None

    def aggregate_phase(self, name: str, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                        failures: list[Any]) -> Parameters | None:
        """The replies of the phase :meth:`configure_phase` asked for; returns the parameters the round
        starts from (None: unchanged)."""
        raise FedpersError(f"{type(self).__name__} asked for phase '{name}' but does not aggregate it")

    # --- checkpoint / resume (fedpers/core/checkpoint.py) ------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Method-specific server state to checkpoint: name -> ndarray or JSON value (default: none)."""
        return {}

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned (default: nothing to do)."""

    def state_dict(self) -> dict[str, Any]:
        """Server state after the last finished round: the record (:meth:`RoundBook.state_dict`: round,
        history, totals, ...), the global model, the RNG and the method's own state."""
        import torch

        return {
            **self.book.state_dict(),
            "model": {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()},
            "torch_rng": torch.get_rng_state().numpy(),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the inverse; the writer, if any, gets the finished rounds again)."""
        import torch

        tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in state["model"].items()}
        self.model.load_state_dict(tensors)
        if state.get("torch_rng") is not None:
            torch.set_rng_state(torch.as_tensor(np.asarray(state["torch_rng"], dtype=np.uint8)))
        self.load_extra_state(dict(state.get("extra", {})))
        self.book.load_state_dict(state)

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
        self.book.start()
        proxies = self.roster.proxies(client_manager, server_round, self.book.current)
        chosen = self.roster.fit_sample(server_round, proxies)
        require_fitting_nodes(self.book.current, server_round, len(proxies), self.federation.num_clients,
                              self.cfg.fraction_fit, self.cfg.min_fit_updates)
        self.book.current["fit_clients"] = chosen
        self.book.fit_sampled.update(chosen)
        ins = FitIns(parameters, self.message_config(server_round))
        self.book.current["bytes_down"] += parameters_nbytes(parameters) * len(chosen)
        if self.book.pending is None:
            return [(proxies[p], ins) for p in chosen]
        carrying = FitIns(parameters, with_evaluation(ins.config, self.book.pending["round"]))
        deferred = set(self.book.pending["state"]["deferred"])
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
            arrays, counts = join_sections(content_for(self.roster.partition_of[proxy.cid]), self.broadcast_sections)
            params = ndarrays_to_parameters(arrays)
            sent += parameters_nbytes(params)
            out.append((proxy, FitIns(params, {**ins.config, **counts})))
        self.book.current["bytes_down"] = sent
        return out

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Validate every update, drop the bad ones (logged), and aggregate the rest; first, the record of a
        pending previous round with the evaluations these replies carry."""
        refuse_if_stopping(server_round, "fit", len(failures))
        results = self.roster.in_partition_order(results)
        if self.book.pending is not None:
            self.book.complete_pending(results, self.finish_round)
        valid: Updates = {}
        for proxy, res in results:
            self.book.current["bytes_up"] += parameters_nbytes(res.parameters)
            pid = self.roster.partition_of.get(proxy.cid, "?")
            if isinstance(pid, int):
                self.book.fit_answered.add(pid)  # it trained, whether or not its update is valid
            sections, problem = self._upload_of(res, pid)
            if not problem and (not isinstance(pid, int) or pid in valid):
                problem = "no partition id for this node" if not isinstance(pid, int) else "a second update this round"
            if problem:
                self.book.current["rejected"] += 1
                log(WARNING, "round %d: rejected update from client %s (node %s): %s",
                    server_round, pid, proxy.cid, problem)
                continue
            valid[pid] = Upload(sections.pop(MODEL_SECTION, []), int(res.num_examples), sections)
            if "node" in res.metrics:
                self.book.current["fit_nodes"][str(pid)] = str(res.metrics["node"])
            loss = res.metrics.get("train_loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                self.book.current["losses"].append((float(loss), int(res.num_examples)))
            if "state_digest" in res.metrics:
                self.book.last_fit_digest[pid] = str(res.metrics["state_digest"])
        for failure in failures:
            self.book.current["failures"] += 1
            log(WARNING, "round %d: a client failed during fit: %s", server_round, describe_failure(failure))
        if len(valid) < self.cfg.min_fit_updates:
            raise FedpersError(
                f"round {server_round}: {len(valid)} valid client updates, fewer than min_fit_updates="
                f"{self.cfg.min_fit_updates} ({self.book.current['rejected']} rejected, {self.book.current['failures']} failed)"
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
        # The encoded payload is not read again: dropping it now means a round's replies are held once
        # (decoded), not twice, while the rest of the round's replies are decoded.
        res.parameters.tensors.clear()
        try:
            sections = split_sections(arrays, res.metrics, self.upload_sections)
        except SectionError as exc:
            return {}, str(exc)
        for name, shapes in self.upload_section_shapes().items():
            problem = update_problem(sections[name], shapes, res.num_examples, self.roster.max_samples(pid))
            if problem:
                return {}, problem if name == MODEL_SECTION and len(sections) == 1 else f"section '{name}': {problem}"
        return sections, None

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Global accuracy of the shared model on the whole test set (methods with a global model)."""
        if server_round == 0 or not self.has_global_model or not self.book.is_eval_round(server_round):
            self.book.current["global_acc"] = None
            return None
        test = self.federation.test(self.device)
        logits = predict_logits(self.model, test.x)
        acc, loss = accuracy_and_loss(logits, test.y)
        self.book.current["global_acc"] = acc
        if self.personalized_is_global and self.federation.test_covers_every_client:
            # (else, e.g. generated data of many clients, each client evaluates its own test split)
            positions = self.federation.test_positions()
            correct = (logits.argmax(dim=1) == test.y).cpu().numpy()
            # each client's accuracy: the mean over the positions of its own test split in the union
            self.book.current["per_client_from_global"] = {pid: float(correct[pos].mean())
                                                     for pid, pos in enumerate(positions) if len(pos)}
            self.book.current["eval_counts"] = {pid: len(pos) for pid, pos in enumerate(positions)}
        return loss, {"global_acc": acc}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Every client evaluates its personalized model (eval rounds only)."""
        if not self.book.is_eval_round(server_round):
            self.finish_round(server_round, None, {})
            return []
        sample = self.roster.evaluation_sample(server_round)
        if self.personalized_is_global and "per_client_from_global" in self.book.current:
            # no client state is involved: the evaluated model is the one the server holds
            per_client = {pid: acc for pid, acc in self.book.current["per_client_from_global"].items()
                          if sample is None or pid in sample}
            self.finish_round(server_round, per_client, {"client_state_consistent": True})
            return []
        proxies = self.roster.proxies(client_manager, server_round, self.book.current)
        if sample is not None:
            proxies = {pid: proxies[pid] for pid in sorted(sample) if pid in proxies}
        deferred = set(self.roster.fit_sample(server_round + 1, proxies)) if self._carries(server_round) else set()
        self.book.current["evaluations"] = []
        self.book.current["deferred"] = sorted(deferred)
        asked = [p for p in sorted(proxies) if p not in deferred]
        self.book.current["bytes_down"] += parameters_nbytes(parameters) * len(asked)
        if not asked:  # Flower calls aggregate_evaluate only after messages were sent
            self.book.end_evaluation(server_round, self.finish_round)
        ins = EvaluateIns(parameters, self.message_config(server_round))
        return [(proxies[p], ins) for p in asked]

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        """Personalized macro accuracy: the mean over clients of each client's own test accuracy (the
        round's record waits for the evaluations carried by the next round's fit replies, if any)."""
        refuse_if_stopping(server_round, "evaluation", len(failures))
        results = self.roster.in_partition_order(results)
        evaluations = [(float(res.loss), int(res.num_examples), dict(res.metrics)) for _, res in results]
        self.book.current.setdefault("evaluations", []).extend(evaluations)
        for failure in failures:
            self.book.current["failures"] += 1
            log(WARNING, "round %d: a client failed during evaluate: %s", server_round, describe_failure(failure))
        self.book.end_evaluation(server_round, self.finish_round)
        total = sum(n for _, n, _ in evaluations)
        loss = sum(l * n for l, n, _ in evaluations) / total if total else None
        return loss, {"personalized_macro_acc": mean_of(float(m["acc"]) for _, _, m in evaluations)}

    # --- evaluations carried by the next round's fit messages ---------------------------------------
    def _carries(self, server_round: int) -> bool:
        """Whether round ``server_round``'s evaluation of the next round's clients goes with their fit."""
        return (self.cfg.evaluate_with_next_fit and self.fit_carries_evaluation
                and server_round < self.cfg.rounds)

    def finish_round(self, server_round: int, per_client: dict[int, float] | None, extras: dict[str, Any]) -> None:
        """Write the round's record (:meth:`RoundBook.finish`); a method adds its own round metrics to
        ``extras`` here (FedEAGD's communication and drift figures)."""
        self.book.finish(server_round, per_client, extras)


def describe_failure(failure: Any) -> str:
    """One line on a failed client message: the exception, or the reply's status (Flower hands over either)."""
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    if isinstance(failure, tuple) and len(failure) == 2:
        proxy, res = failure
        status = getattr(res, "status", None)
        return f"node {getattr(proxy, 'cid', '?')}: {getattr(status, 'message', res)}"
    return str(failure)
