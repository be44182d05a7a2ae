"""The only places where fedpers goes past Flower's public API (pinned flwr 1.42), each with its reason.

Everything else uses names Flower exports (``flwr.app``, ``flwr.client``, ``flwr.common``, ``flwr.server``,
``flwr.server.strategy.Strategy``; ``flwr.server.client_proxy.ClientProxy`` is the type the legacy
Strategy API hands to every round method). ``tests/test_layers.py`` fails on a private Flower name
imported anywhere but here. On a Flower upgrade, check these two first.
"""

from __future__ import annotations

import timeit
from logging import INFO
from typing import Any

from flwr.common import log
from flwr.server import History, Server


def run_simulation_engine(*, num_supernodes: int, client_app_attr: str, server_app, backend_config: dict,
                          server_app_context, app_dir: str, verbose: bool) -> None:
    """Run the Ray simulation engine in this process with one SuperNode per client.

    Why private: the public ``flwr.simulation.run_simulation`` takes a ClientApp object and gives every
    simulated SuperNode an empty run-config; ``_run_simulation(is_app=True, app_dir=...)`` is what
    ``flwr-simulation`` itself calls to make the SuperNodes read the run's config from an app directory.
    ``flwr run .`` is public but starts a SuperLink that outlives the command."""
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    _run_simulation(
        num_supernodes=num_supernodes,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app_attr=client_app_attr,
        server_app=server_app,
        backend_name="ray",
        backend_config=backend_config,
        server_app_context=server_app_context,
        app_dir=app_dir,
        verbose_logging=verbose,
        is_app=True,  # makes the engine read the run-config from app_dir for every SuperNode
    )


class ResumableServer(Server):
    """Flower's legacy ``Server`` whose round loop starts at ``start_round`` (1 = a fresh run): resume
    after a checkpoint (fedpers/core/checkpoint.py).

    Why a copy: ``Server.fit`` always counts from round 1 and has no hook for the first round; this copy
    of its loop (and its call of the private ``Server._get_initial_parameters``) differs only in the
    first round.
    """

    def __init__(self, *, start_round: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        self.start_round = int(start_round)

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:  # noqa: D102
        history = History()
        log(INFO, "[INIT] resuming at round %s of %s", self.start_round, num_rounds)
        self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
        start_time = timeit.default_timer()
        for current_round in range(self.start_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s]", current_round)
            res_fit = self.fit_round(server_round=current_round, timeout=timeout)
            if res_fit is not None:
                parameters_prime, fit_metrics, _ = res_fit
                if parameters_prime:
                    self.parameters = parameters_prime
                history.add_metrics_distributed_fit(server_round=current_round, metrics=fit_metrics)
            res_cen = self.strategy.evaluate(current_round, parameters=self.parameters)
            if res_cen is not None:
                history.add_loss_centralized(server_round=current_round, loss=res_cen[0])
                history.add_metrics_centralized(server_round=current_round, metrics=res_cen[1])
            res_fed = self.evaluate_round(server_round=current_round, timeout=timeout)
            if res_fed is not None and res_fed[0] is not None:
                history.add_loss_distributed(server_round=current_round, loss=res_fed[0])
                history.add_metrics_distributed(server_round=current_round, metrics=res_fed[1])
        return history, timeit.default_timer() - start_time
