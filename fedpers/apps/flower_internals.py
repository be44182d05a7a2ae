"""The only places where fedpers goes past Flower's public API (pinned flwr 1.42), each with its reason.

Everything else uses names Flower exports (``flwr.app``, ``flwr.client``, ``flwr.common``, ``flwr.server``,
``flwr.server.strategy.Strategy``; ``flwr.server.client_proxy.ClientProxy`` is the type the legacy
Strategy API hands to every round method). ``tests/test_layers.py`` fails on a private Flower name
imported anywhere but here. On a Flower upgrade, check these first. One more guard lives here because
Flower's simulation triggers it: :func:`serialize_ast_parse`.
"""

from __future__ import annotations

import ast
import threading
import timeit
from logging import INFO
from typing import Any

from flwr.common import log
from flwr.server import History, Server
from flwr.server.server import fit_clients

from fedpers.core.errors import refuse_if_stopping


def run_simulation_engine(*, num_supernodes: int, client_app_attr: str, server_app, backend_config: dict,
                          server_app_context, app_dir: str, verbose: bool) -> None:
    """Run the Ray simulation engine in this process with one SuperNode per client.

    Why private: the public ``flwr.simulation.run_simulation`` takes a ClientApp object and gives every
    simulated SuperNode an empty run-config; ``_run_simulation(is_app=True, app_dir=...)`` is what
    ``flwr-simulation`` itself calls to make the SuperNodes read the run's config from an app directory.
    ``flwr run .`` is public but starts a SuperLink that outlives the command."""
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    serialize_ast_parse()
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


_AST_LOCK = threading.Lock()


def serialize_ast_parse() -> None:
    """Make ``ast.parse`` one call at a time in this process (idempotent).

    Why: the simulation engine checks the ServerApp's and the ClientApp's references with ``ast.parse`` in
    two threads at once (``flwr.supercore.object_ref``), and CPython 3.11's AST constructor keeps its
    recursion depth per interpreter, not per thread (python/cpython gh-106905), so two parses that overlap
    can fail with "SystemError: AST constructor recursion depth mismatch" and end the run; seen under load
    in this project's tests."""
    if getattr(ast.parse, "_fedpers_serialized", False):
        return
    parse = ast.parse

    def serialized_parse(*args: Any, **kwargs: Any):
        with _AST_LOCK:
            return parse(*args, **kwargs)

    serialized_parse._fedpers_serialized = True  # type: ignore[attr-defined]
    serialized_parse.__doc__ = parse.__doc__
    ast.parse = serialized_parse


class ResumableServer(Server):
    """fedpers' one round loop: Flower's legacy ``Server`` loop, starting at ``start_round`` (1 = a fresh run;
    later: resume after a checkpoint, fedpers/core/checkpoint.py) and ending after ``stop_after`` (None: the
    config's rounds). Every engine drives it: the simulation and a deployment (the ServerApp, through
    ``start_grid``) and the in-process engine (:mod:`fedpers.apps.inprocess`, with in-process proxies).

    Why a copy: ``Server.fit`` always counts from round 1 and has no hook for the first or the last round;
    this copy of its loop (and its call of the private ``Server._get_initial_parameters``) differs only there.
    A fresh run evaluates the initial parameters (round 0) as ``Server.fit`` does; a resumed one does not.
    A round may open with a phase the strategy asks for (:meth:`run_phase`: JDFL's discovery before round 1).
    """

    def __init__(self, *, start_round: int = 1, stop_after: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.start_round = int(start_round)
        self.stop_after = stop_after

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:  # noqa: D102
        history = History()
        if self.start_round > 1:
            log(INFO, "[INIT] resuming at round %s of %s", self.start_round, num_rounds)
        self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
        if self.start_round == 1:
            res = self.strategy.evaluate(0, parameters=self.parameters)
            if res is not None:
                history.add_loss_centralized(server_round=0, loss=res[0])
                history.add_metrics_centralized(server_round=0, metrics=res[1])
        last = num_rounds if self.stop_after is None else min(num_rounds, self.stop_after)
        start_time = timeit.default_timer()
        for current_round in range(self.start_round, last + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s]", current_round)
            self.run_phase(current_round, timeout)
            res_fit = self.fit_round(server_round=current_round, timeout=timeout)
            if res_fit is not None:
                parameters_prime, fit_metrics = res_fit[0], res_fit[1]
                if parameters_prime:
                    self.parameters = parameters_prime
                history.add_metrics_distributed_fit(server_round=current_round, metrics=fit_metrics)
            # Unlike Server.fit, let go of the round's replies (a model per sampled client) now, not when the
            # next round's replies replace them: the driver holds one round of replies, not two.
            res_fit = None
            res_cen = self.strategy.evaluate(current_round, parameters=self.parameters)
            if res_cen is not None:
                history.add_loss_centralized(server_round=current_round, loss=res_cen[0])
                history.add_metrics_centralized(server_round=current_round, metrics=res_cen[1])
            res_fed = self.evaluate_round(server_round=current_round, timeout=timeout)
            if res_fed is not None and res_fed[0] is not None:
                history.add_loss_distributed(server_round=current_round, loss=res_fed[0])
                history.add_metrics_distributed(server_round=current_round, metrics=res_fed[1])
        return history, timeit.default_timer() - start_time

    def run_phase(self, server_round: int, timeout: float | None) -> None:
        """A phase before the round's fit, if the strategy asks for one: its ``configure_phase(round,
        parameters, client_manager)`` gives ``(name, [(proxy, FitIns), ...])`` or None; the clients' replies
        (through Flower's ``fit_clients``, as a round's fit) go to its ``aggregate_phase(name, round, results,
        failures)``, which returns the parameters the round starts from (None: unchanged)."""
        configure = getattr(self.strategy, "configure_phase", None)
        asked = configure(server_round, self.parameters, self._client_manager) if configure else None
        if not asked:
            return
        name, instructions = asked
        log(INFO, "[ROUND %s] phase '%s' on %s clients", server_round, name, len(instructions))
        results, failures = fit_clients(instructions, max_workers=self.max_workers, timeout=timeout,
                                        group_id=server_round)
        refuse_if_stopping(server_round, f"phase '{name}'", len(failures))
        parameters = self.strategy.aggregate_phase(name, server_round, results, failures)
        if parameters is not None:
            self.parameters = parameters


def simulation_poll_sweep_seconds(nodes: int, repeats: int = 3) -> float:
    """Seconds of one sweep of Flower 1.42's simulation message poll (``vce_api.add_messages_to_queue``:
    ``get_message_ins`` once per registered node) over ``nodes`` nodes with no message waiting, the mean of
    ``repeats``; used by ``benchmarks/flower_poll.py`` to say where a many-client round's driver time goes."""
    import importlib
    import time

    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory

    simulation = importlib.import_module("flwr.simulation.run_simulation")  # the module, not its function
    factory = LinkStateFactory(simulation.FLWR_IN_MEMORY_DB_NAME, simulation.NoOpFederationManager(),
                               simulation.ObjectStoreFactory())
    mapping = _register_nodes(nodes, factory)
    state = factory.state()
    start = time.perf_counter()
    for _ in range(repeats):
        for node_id in mapping:
            state.get_message_ins(node_id=node_id, limit=1)
    return (time.perf_counter() - start) / repeats
