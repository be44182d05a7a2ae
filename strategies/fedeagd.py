"""FedEAGD server (paper summary in ``shared/papers/fedeagd-summary.txt``).

* Broadcast and aggregation: only the shared feature extractor (the SE-CNN ``backbone``) is sent and
  averaged, sample-weighted; heads, personalized residuals and EMA teachers stay on the clients.
* There is no global head, hence no global accuracy (as FedPer): judged by personalized macro accuracy.
* Communication accounting as in the summary ("the shared feature extractor transferred in both
  directions per participating client per round"): every round record carries the serialized bytes one
  participating client received (``bytes_down_per_client``) and sent (``bytes_up_per_client``) in fit,
  their sum, and the raw fp32 size ``shared_params x 4``; ``summary.json`` carries the parameter count and
  the totals. ``bytes_up``/``bytes_down`` (all messages, evaluation broadcasts included) are unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar
from flwr.server import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedpers.algorithms.fedeagd import FIT_STATISTICS
from fedpers.core.models import parameter_count
from fedpers.core.wire import BACKBONE_ONLY
from strategies.base import FedPersStrategy, parameters_nbytes

# The clients' per-round mechanism statistics each record carries (FIT_STATISTICS, declared with the math:
# sample-weighted means over the round's clients, the maximum drift a maximum; None before any client has
# a teacher). summary.json names them ("round_statistics"), so that `fedpers report` tabulates them
# (round_statistics.md): whether lambda leaves its base, how far it spreads, how much of the loss it is.
ROUND_STATISTICS = tuple(f"fedeagd_{name}" for name in FIT_STATISTICS)

FP32_BYTES = 4


class FedEAGDStrategy(FedPersStrategy):
    """Shared-extractor-only broadcast and sample-weighted aggregation, with per-client byte accounting."""

    contract = BACKBONE_ONLY
    has_global_model = False
    model_kind = "se_cnn"

    def prepare_global_model(self) -> None:
        """Count the shared extractor's parameters once (the unit of the communication accounting)."""
        self.shared_params = parameter_count(self.model, "backbone")
        self.comm_totals = {"fit_bytes_up": 0, "fit_bytes_down": 0, "fit_messages": 0}
        self.last_comm: dict[str, Any] = {}

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        """As the base; also notes the size of one fit broadcast."""
        out = super().configure_fit(server_round, parameters, client_manager)
        mine = self.book.values()
        mine["fit_down_each"] = parameters_nbytes(parameters)
        mine["fit_down_total"] = parameters_nbytes(parameters) * len(out)
        return out

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        """As the base; also records per-client upload sizes and the clients' mechanism statistics."""
        ups = [parameters_nbytes(res.parameters) for _, res in results]
        mine = self.book.values()
        mine["fit_up_each"] = ups
        for name in FIT_STATISTICS:
            vals = [(float(res.metrics[name]), res.num_examples) for _, res in results
                    if isinstance(res.metrics.get(name), (int, float)) and math.isfinite(res.metrics[name])]
            n = sum(c for _, c in vals)
            if name == "max_drift":
                mine[name] = max((v for v, _ in vals), default=None)
            else:
                # fsum: exactly rounded, so the mean does not depend on the order the replies arrived in
                # (a resumed run gets them in another order than an uninterrupted one)
                mine[name] = math.fsum(v * c for v, c in vals) / n if n else None
        return super().aggregate_fit(server_round, results, failures)

    def finish_round(self, server_round: int, per_client: dict[int, float] | None, extras: dict[str, Any]) -> None:
        """As the base, with the round's communication per client and the clients' drift statistics."""
        r = self.book.values()
        ups = r.get("fit_up_each", [])
        up_each = int(round(float(np.mean(ups)))) if ups else 0
        down_each = int(r.get("fit_down_each", 0)) if ups else 0
        comm = {
            "shared_params": self.shared_params,
            "shared_bytes_fp32": self.shared_params * FP32_BYTES,
            "bytes_up_per_client": up_each,
            "bytes_down_per_client": down_each,
            "bytes_per_client_bidirectional": up_each + down_each,
            "fit_bytes_up": int(sum(ups)),
            "fit_bytes_down": int(r.get("fit_down_total", 0)),
            **{name: r.get(name.removeprefix("fedeagd_")) for name in ROUND_STATISTICS},
        }
        self.comm_totals["fit_bytes_up"] += comm["fit_bytes_up"]
        self.comm_totals["fit_bytes_down"] += comm["fit_bytes_down"]
        self.comm_totals["fit_messages"] += len(ups)
        if ups:
            self.last_comm = comm
        super().finish_round(server_round, per_client, {**extras, **comm})

    def summary_extras(self) -> dict[str, Any]:
        """Shared-extractor size and per-client, per-round communication (fit messages, both directions)."""
        fp32 = self.shared_params * FP32_BYTES
        last = self.last_comm
        return {
            "round_statistics": list(ROUND_STATISTICS),
            "shared_params": self.shared_params,
            "shared_bytes_fp32": fp32,
            "shared_bytes_fp32_bidirectional": 2 * fp32,
            "bytes_up_per_client_per_round": last.get("bytes_up_per_client"),
            "bytes_down_per_client_per_round": last.get("bytes_down_per_client"),
            "bytes_per_client_per_round_bidirectional": last.get("bytes_per_client_bidirectional"),
            "fit_bytes_up": self.comm_totals["fit_bytes_up"],
            "fit_bytes_down": self.comm_totals["fit_bytes_down"],
            "fit_messages": self.comm_totals["fit_messages"],
        }
