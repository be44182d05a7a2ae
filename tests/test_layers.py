"""Layers import one way (apps -> registry -> strategies/, clients/ -> fedpers/algorithms -> core), a module's
layer is its folder, with no cycle and no import between strategies/ and clients/; private Flower names only in fedpers/apps/flower_internals.py; what a
method's strategy and client declare about it agrees."""

from __future__ import annotations

import ast

import pytest

from fedpers.registry.methods import METHODS
from tests.import_graph import ROOT, SHIMS, cycles, graph, layer_of, modules, stray_modules, violations


def test_no_import_cycle_across_fedpers_strategies_and_clients():
    assert cycles(graph()) == []


def test_every_import_goes_down_a_layer_and_methods_never_import_each_other():
    assert violations(graph()) == []


def test_the_checker_sees_a_cycle_a_string_import_and_an_upward_import():
    edges = {"fedpers.core.models": {"fedpers.registry.methods"}, "fedpers.registry.methods": {"strategies.fedavg"},
             "strategies.fedavg": {"fedpers.core.models", "clients.fedavg"}, "clients.fedavg": set()}
    assert cycles(edges) == [["fedpers.core.models", "fedpers.registry.methods", "strategies.fedavg"]]
    assert violations(edges) == [
        "fedpers.core.models (core) imports fedpers.registry.methods (registry)",
        "strategies.fedavg imports clients.fedavg: strategies/ and clients/ never import each other",
    ]
    registry = graph()["fedpers.registry.methods"]  # "module:Class" strings are edges
    assert {"strategies.fedrep", "clients.fedrep"} <= registry


def test_a_modules_layer_is_its_folder():
    assert [layer_of(m) for m in ("fedpers.apps.cli", "fedpers.registry.methods", "fedpers.registry.config", "clients.base",
                                  "strategies.jdfl", "fedpers.algorithms.fedrep", "fedpers.core.schema")] == [
        "apps", "registry", "registry", "methods", "methods", "math", "core"]
    # every module of fedpers/ is in a layer folder, except the package, `python -m fedpers` and the shims
    assert stray_modules(modules()) == []
    assert {m for m in modules() if m.startswith("fedpers") and m.count(".") <= 1
            and not m.startswith(("fedpers.apps", "fedpers.core", "fedpers.registry", "fedpers.algorithms"))} == {
        "fedpers", "fedpers.__main__", *SHIMS}


def test_the_checker_refuses_a_stray_module_an_upward_math_import_and_a_shim_that_does_more():
    edges = {"fedpers.helpers": {"fedpers.core.schema"}, "fedpers.core.schema": set(),
             "fedpers.algorithms.pfedkdh": {"strategies.pfedkdh"}, "strategies.pfedkdh": set(),
             "fedpers.app": {"fedpers.apps.server_app", "fedpers.core.schema"}, "fedpers.apps.server_app": set()}
    assert violations(edges) == [
        "fedpers.helpers is in no layer folder (clients/, fedpers/algorithms/, fedpers/apps/, fedpers/core/, "
        "fedpers/registry/, strategies/)",
        "fedpers.app (deprecated shim) imports ['fedpers.apps.server_app', 'fedpers.core.schema'], "
        "not only fedpers.apps.server_app",
        "fedpers.algorithms.pfedkdh (math) imports strategies.pfedkdh (methods)",
    ]


def test_the_deprecated_paths_still_work_and_say_where_to_go():
    import importlib
    import sys
    import warnings

    for shim, target in SHIMS.items():
        sys.modules.pop(shim, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(shim)
        assert any(target in str(w.message) for w in caught if w.category is DeprecationWarning), shim
        real = importlib.import_module(target)
        exported = [name for name in vars(module) if not name.startswith("_") and name != "warnings" and name != "sys"]
        assert exported and all(getattr(module, name) is getattr(real, name) for name in exported)


def private_flower_imports(path) -> list[str]:
    """``module.name`` of every private Flower name (a ``_`` part) that ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "flwr":
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if any(part.startswith("_") for part in dotted.split(".")) or ".supercore" in dotted:
                    found.append(dotted)
    return found


def test_private_flower_names_only_in_flower_internals():
    files = list(modules().items()) + [(p.stem, p) for p in sorted((ROOT / "benchmarks").glob("*.py"))]
    offenders = {name: private_flower_imports(path) for name, path in files if name != "fedpers.apps.flower_internals"}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert private_flower_imports(ROOT / "fedpers" / "apps" / "flower_internals.py") == [
        "flwr.simulation.run_simulation._run_simulation", "flwr.supercore.telemetry.EventType",
        "flwr.server.superlink.fleet.vce.vce_api._register_nodes"]  # benchmarks/flower_poll.py's measurement


@pytest.mark.parametrize("name", sorted(METHODS))
def test_strategy_and_client_declare_the_same_model_and_parts(name):
    strategy, client = METHODS[name].strategy_class(), METHODS[name].client_class()
    assert strategy.model_kind == client.model_kind
    # what the server broadcasts is what the client loads, what the client uploads is what the server checks:
    # one Contract (model parts and named sections), declared once and named by both
    assert strategy.contract == client.contract
    for cls in (strategy, client):  # nothing redeclares a part of it on the side
        for klass in cls.__mro__[:-1]:
            if klass.__name__ not in ("FedPersStrategy", "FedPersClient", "ContractSide"):
                assert not {"download_part", "upload_part", "broadcast_sections", "upload_sections"} & set(vars(klass)), klass


def test_the_methods_with_extra_arrays_name_every_section():
    sections = {name: (METHODS[name].strategy_class().contract.broadcast, METHODS[name].strategy_class().contract.upload)
                for name in ("scaffold", "feddc", "fedproc", "fedproto", "fedas", "fedfed", "fedavg", "feddyn")}
    assert sections == {
        "scaffold": (("model", "server_control"), ("model", "control_delta")),
        "feddc": (("model", "update_rate"), ("model", "update_rate_delta")),
        "fedproc": (("model", "global_prototypes", "prototype_mask"), ("model", "class_prototypes", "class_counts")),
        "fedproto": (("global_prototypes", "prototype_mask"), ("class_prototypes", "class_counts")),
        "fedas": (("model",), ("model", "fisher_trace")),
        "fedfed": (("model", "shared_features", "shared_labels"), ("model", "shared_features", "shared_labels")),
        "fedavg": (("model",), ("model",)),
        "feddyn": (("model",), ("model",)),  # h stays on the server
    }


def test_headline_metrics_and_models_of_the_methods():
    # as the registry table said before the classes declared them
    global_optimizers = {"fedavg", "fedprox", "scaffold", "feddyn", "feddc", "fedproc", "moon"}
    assert global_optimizers <= {n for n, s in METHODS.items() if s.metric == "global_acc"}
    assert {"pfedkdh", "fedper", "fedeagd", "ditto", "fedrep", "fedfed"} <= {
        n for n, s in METHODS.items() if s.metric == "personalized_macro_acc"}
    # a method judged by its global model is one whose clients all evaluate that model
    assert all((s.metric == "global_acc") == s.strategy_class().personalized_is_global for s in METHODS.values())
    assert METHODS["fedeagd"].client_class().model_kind == "se_cnn"
    assert {n for n, s in METHODS.items() if s.needs_aux} == {"pfedkdh"}


def test_readme_method_table_lists_exactly_the_registry():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| method | paper | judged by |"):].split("\n\n")[0].splitlines()[2:]
    rows = [[cell.strip(" `") for cell in line.strip("|").split("|")] for line in table]
    assert [(name, paper, metric) for name, paper, metric in rows] == [
        (s.name, s.paper, s.metric) for s in METHODS.values()]


def test_wire_helpers_round_trip_exactly():
    from fedpers.core.wire import float_row, float_row_of, round_config, server_round_of

    row = [0.55, 0.45 / 3, 1 / 3, 1e-300]
    assert float_row_of({"jdfl_row": float_row(row)}, "jdfl_row", (1.0,)) == row
    assert float_row_of({}, "jdfl_row", (1.0,)) == [1.0]
    assert server_round_of(round_config(7, jdfl_m=2)) == 7 and server_round_of({}) == 0
    assert round_config(3, jdfl_m=2) == {"server_round": 3, "jdfl_m": 2}


def test_strategies_keep_per_round_values_only_under_the_declared_round_keys():
    import re

    from strategies.rounds import RoundState

    used = set()
    for path in (ROOT / "strategies").glob("*.py"):
        used |= set(re.findall(r"""\.current(?:\[|\.get\(|\.setdefault\()\s*["'](\w+)["']""", path.read_text()))
    assert used and used <= set(RoundState.__annotations__), sorted(used - set(RoundState.__annotations__))
