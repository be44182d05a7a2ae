"""JDFL server side, as a wrapper over any global optimizer's Strategy (config ``jdfl: graded | random |
hard`` next to ``method: fedavg | scaffold | feddyn | feddc | fedproc | moon``); no optimizer code is
copied: :func:`with_jdfl` composes :class:`JDFLStrategyMixin` with the method's class.

Where JDFL sits in the round structure (our choice): **Phase 1 is a phase of round 1 in the round loop**
(``configure_phase`` / ``aggregate_phase``, run by fedpers' one loop before round 1's clients are sampled).
The server sends the seeded initial model theta^0 (C-class head) to *every* client (a fit message with
config ``jdfl_phase=discovery``, through Flower's ``fit_clients`` as a round's fit); each client trains E0
epochs of plain cross-entropy SGD from theta^0 and returns only its update on the layer subset
(``jdfl_layers``). The server checks every update (shapes, finiteness), l2-normalises, clusters with
K-means and picks M (fixed ``jdfl_m``, elbow or silhouette), records z_i, centroids and the ARI against
the true client domains when the data has domain ids. **Phase 2**: the head is replaced by a seeded
``Linear(F, M*C)`` (backbone = theta^0; the discovery updates are discarded) and the optimizer's server
state is rebuilt for the new shapes, all before round 1 trains. Rounds 1..R are then the optimizer's own,
except that each client's FitIns config carries M and its pseudo-domain mass row (graded: alpha on z_i,
(1-alpha) w_{z_i d'} elsewhere; hard ablation: one-hot z_i). Discovery traffic is counted in round 1's
bytes. The global model is evaluated with class-only accuracy on the union of the clients' test splits,
and per domain (``global_acc_domain_<name>``) when the data has domain ids.
"""

from __future__ import annotations

import functools
import time
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common import log

from fedpers.core.errors import FedpersError
from fedpers.algorithms.jdfl import (DISCOVERY_BROADCAST, DISCOVERY_UPLOAD, adjusted_rand_index,
                                     centroid_similarity_weights, class_only_predictions, default_alpha,
                                     discover_domains, graded_domain_row, hard_domain_row, marginal_class_log_probs,
                                     per_domain_accuracy)
from fedpers.core import seeds
from fedpers.core.models import expand_head, get_arrays, layer_subset_names
from fedpers.core.training import predict_logits
from fedpers.core.validation import update_problem
from fedpers.core.wire import JDFL_ROW, MODEL_SECTION, float_row, join_sections, round_config, split_sections
from strategies.base import describe_failure, parameters_nbytes



class JDFLStrategyMixin:
    """Discovery before round 1, M x C head, per-client targets config, class-only evaluation."""

    # the clients evaluate the class-only accuracy of their joint head themselves, also over FedAvg
    personalized_is_global = False

    def __init__(self, *args, **kwargs):
        self.discovery = None
        self._discovery_bytes = 0  # Phase 1's traffic, counted in round 1's bytes
        self._discovery_started = 0.0
        self.jdfl_info: dict[str, Any] = {}
        self.client_rows: dict[int, np.ndarray] = {}
        super().__init__(*args, **kwargs)

    # --- Phase 1 + 2 -------------------------------------------------------------------------------------
    def configure_phase(self, server_round, parameters, client_manager):
        """Phase 1, before round 1 (while no discovery is installed): theta^0 to every connected client with
        ``jdfl_phase=discovery``. Returns ``("discovery", [(proxy, FitIns), ...])`` or None."""
        if self.discovery is not None:
            return None
        self._discovery_started = time.perf_counter()
        proxies = self.roster.proxies(client_manager, server_round, self.book.current)
        arrays, counts = join_sections({MODEL_SECTION: get_arrays(self.model, "all")}, DISCOVERY_BROADCAST)
        ins = FitIns(ndarrays_to_parameters(arrays), round_config(0, jdfl_phase="discovery", **counts))
        self._discovery_bytes = parameters_nbytes(ins.parameters) * len(proxies)
        return "discovery", [(proxies[pid], ins) for pid in sorted(proxies)]

    def aggregate_phase(self, name, server_round, results, failures):
        """Phase 1's replies: check each update (shapes, finiteness), cluster them (K-means, M), then Phase 2
        (head expansion). Returns the parameters round 1 starts from."""
        cfg = self.cfg
        names = layer_subset_names(self.model, cfg.jdfl_layers)
        state = self.model.state_dict()
        shapes = [tuple(state[n].shape) for n in names]
        vectors: dict[int, np.ndarray] = {}
        for proxy, res in self.roster.in_partition_order(results):
            pid = self.roster.partition_of[proxy.cid]
            self._discovery_bytes += parameters_nbytes(res.parameters)
            try:
                arrays = split_sections(parameters_to_ndarrays(res.parameters), res.metrics,
                                        DISCOVERY_UPLOAD)["discovery_update"]
                problem = update_problem(arrays, shapes, res.num_examples, self.roster.max_samples(pid))
            except Exception as exc:  # an undecodable reply
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                log(WARNING, "JDFL discovery: update of client %s left out: %s", pid, problem)
                continue
            vectors[pid] = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
        for failure in failures:  # a client lost during discovery
            log(WARNING, "JDFL discovery: a client failed: %s", describe_failure(failure))
        if not vectors:
            raise FedpersError("JDFL discovery: no client returned a valid update vector")
        pids = sorted(vectors)
        found = discover_domains(np.stack([vectors[p] for p in pids]), num_domains=cfg.jdfl_m,
                                 select=cfg.jdfl_select, max_domains=cfg.jdfl_max_m, seed=cfg.seed)
        assignments = {p: z for p, z in zip(pids, found.assignments)}
        for p in range(self.federation.num_clients):  # a client missing from discovery: pseudo-domain 0
            assignments.setdefault(p, 0)
        self.install_discovery(found.num_domains, assignments, found.centroids,
                               info={**found.to_json(), "clustered_clients": pids})
        self.jdfl_info["discovery_seconds"] = time.perf_counter() - self._discovery_started
        return ndarrays_to_parameters(self.download_arrays())

    def install_discovery(self, num_domains: int, assignments: dict[int, int], centroids: np.ndarray,
                          info: dict[str, Any] | None = None) -> None:
        """Record M, z_i and centroids, build each client's pseudo-domain mass row, expand the head."""
        cfg = self.cfg
        m = int(num_domains)
        alpha = cfg.jdfl_alpha if cfg.jdfl_alpha > 0 else default_alpha(m)
        weights = centroid_similarity_weights(centroids, cfg.jdfl_tau)
        for pid, z in assignments.items():
            self.client_rows[pid] = (graded_domain_row(z, weights, alpha) if cfg.jdfl == "graded"
                                     else hard_domain_row(z, m))  # random draws per sample on the client
        true = self.federation.client_domains()
        order = sorted(assignments)
        ari = adjusted_rand_index([true[p] for p in order], [assignments[p] for p in order]) if true else None
        self.discovery = {"M": m, "assignments": [int(assignments[p]) for p in order],
                          "centroids": np.asarray(centroids, np.float64)}
        self.jdfl_info = {**(info or {}), "M": m, "assignments": [int(assignments[p]) for p in order],
                          "true_domains": true, "ari": ari, "mode": cfg.jdfl,
                          "alpha": alpha if cfg.jdfl == "graded" else None,
                          "tau": cfg.jdfl_tau if cfg.jdfl == "graded" else None,
                          "phi": cfg.jdfl_phi if cfg.jdfl == "random" else None,
                          "similarity_weights": weights.tolist()}
        log(INFO, "JDFL discovery: M=%d (%s), z=%s, ARI=%s", m, self.jdfl_info.get("criterion", "given"),
            self.jdfl_info["assignments"], ari)
        num_classes = self.federation.num_classes
        expand_head(self.model, m * num_classes, seed=cfg.seed + seeds.JDFL_HEAD_OFFSET)
        self.reset_model_state()  # upload shapes, and server state (SCAFFOLD c, FedDyn h, ...) for the new shapes

    # --- Flower Strategy hooks ------------------------------------------------------------------------------
    def configure_fit(self, server_round, parameters, client_manager):
        """Every round: per-client M and target row in the config (round 1 also records the discovery's
        traffic and time: the phase before it)."""
        if self.discovery is None:
            raise FedpersError("JDFL: round %d has no discovered pseudo-domains; the round loop runs the "
                               "discovery phase first (configure_phase)" % server_round)
        discovery_bytes, self._discovery_bytes = self._discovery_bytes, 0
        pairs = super().configure_fit(server_round, parameters, client_manager)
        if discovery_bytes:
            self.book.current["bytes_down"] += discovery_bytes  # discovery traffic belongs to round 1
            self.book.extras().update(
                jdfl_M=self.discovery["M"], jdfl_ari=self.jdfl_info["ari"],
                jdfl_discovery_seconds=self.jdfl_info["discovery_seconds"])
        out = []
        for proxy, ins in pairs:
            pid = self.roster.partition_of[proxy.cid]
            config = {**ins.config, "jdfl_m": self.discovery["M"],
                      JDFL_ROW: float_row(self.client_rows.get(pid, np.ones(1)))}
            out.append((proxy, FitIns(ins.parameters, config)))
        return out

    def evaluate(self, server_round, parameters):
        """Class-only accuracy of the global M x C model on the global test set, and per domain."""
        if (server_round == 0 or self.discovery is None or not self.has_global_model
                or not self.book.is_eval_round(server_round)):
            return super().evaluate(server_round, parameters)
        test = self.federation.test(self.device)
        num_classes = self.federation.num_classes
        logits = predict_logits(self.model, test.x)
        pred = class_only_predictions(logits, num_classes)
        acc = (pred == test.y).float().mean().item()
        loss = torch.nn.functional.nll_loss(marginal_class_log_probs(logits, num_classes), test.y).item()
        self.book.current["global_acc"] = acc
        extras = self.book.extras()
        domains = self.federation.test_domains()
        if domains is not None:
            names = self.federation.dataset.domain_names
            for d, a in per_domain_accuracy(pred.cpu().numpy(), test.y.cpu().numpy(), domains).items():
                extras[f"global_acc_domain_{names[d] if d < len(names) else d}"] = a
        return loss, {"global_acc": acc}

    def summary_extras(self) -> dict[str, Any]:
        """The discovery record: M, z_i, selection curve, ARI, target parameters."""
        return {**super().summary_extras(), "jdfl": self.jdfl_info}

    # --- checkpoint / resume -----------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        out = dict(super().extra_state())
        if self.discovery is not None:
            out.update(jdfl_M=self.discovery["M"], jdfl_assignments=np.asarray(self.discovery["assignments"]),
                       jdfl_centroids=self.discovery["centroids"])
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        extra = state.get("extra", {})
        if "jdfl_M" in extra and self.discovery is None:  # re-expand before the checkpointed model is loaded
            z = {p: int(v) for p, v in enumerate(np.asarray(extra["jdfl_assignments"]).tolist())}
            self.install_discovery(int(extra["jdfl_M"]), z, np.asarray(extra["jdfl_centroids"]))
        super().load_state_dict(state)


@functools.lru_cache(maxsize=None)
def with_jdfl(strategy_cls: type) -> type:
    """``strategy_cls`` with JDFL: a subclass of both (JDFL hooks first in the MRO)."""
    return type(f"JDFL{strategy_cls.__name__}", (JDFLStrategyMixin, strategy_cls),
                {"__module__": __name__, "__doc__": f"JDFL over {strategy_cls.__name__}."})
