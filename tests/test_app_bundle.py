"""The app bundle (FAB) every way of submitting a run sends: only the app (the packages the ServerApp and
ClientApp import, and pyproject.toml), small, stated in docs/running.md, the same for ``flwr run .``,
``fedpers deploy local`` and the compose stack; and ``flwr run . local`` from this repository (which holds
the committed results) gives the metrics of ``fedpers run`` with the same config and seed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from fedpers.apps.bundle import APP_PACKAGES, FAB_INCLUDE, build, contents, describe, main
from fedpers.apps.deploy import flower_env, free_port
from fedpers.apps.processes import descendants, signal_pids
from fedpers.apps.simulation import write_app_dir
from fedpers.core.results import read_metrics, read_summary
from fedpers.registry.config import build_config
from tests.conftest import ROOT, tiny_overrides
from tests.import_graph import graph

# Upper bounds, well above what is measured (docs/running.md): a bundle that holds the results again
# (453 files, 10.05 MB, near Flower's 10 MiB limit) or any other folder fails long before.
MAX_FILES = 160
MAX_BYTES = 1_500_000
COMPONENTS = ("fedpers.apps.server_app", "fedpers.apps.client_app")


@pytest.fixture(scope="module")
def fab() -> bytes:
    """The bundle Flower builds of this repository (``flwr build``'s code)."""
    return build(ROOT)


def _imported_by_the_apps() -> set[str]:
    """Files of every module the ServerApp and ClientApp import, at any depth (tests/import_graph.py: import
    statements and the registry's "module:Class" strings), with their packages' ``__init__``."""
    edges = graph()
    seen: set[str] = set()
    todo = list(COMPONENTS)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in edges]
        todo += edges.get(module, ())
    files = set()
    for module in seen:
        path = module.replace(".", "/")
        files.add(f"{path}/__init__.py" if (ROOT / path).is_dir() else f"{path}.py")
    return files


def test_the_bundle_holds_the_app_and_nothing_else(fab):
    names = contents(fab)
    assert {name.split("/")[0] for name in names} == {*APP_PACKAGES, "pyproject.toml"}
    expected = {f"{package}/{path.relative_to(ROOT / package).as_posix()}" for package in APP_PACKAGES
                for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts}
    assert set(names) == expected | {"pyproject.toml"}  # every module of the packages, and only those
    missing = _imported_by_the_apps() - set(names)
    assert not missing, f"modules the ServerApp/ClientApp import are not in the bundle: {sorted(missing)}"
    assert len(names) <= MAX_FILES and len(fab) <= MAX_BYTES, describe(fab)
    # Flower reads its manifest back by splitting each line at commas (flwr.cli.install._verify_hashes)
    with zipfile.ZipFile(BytesIO(fab)) as archive:
        manifest = archive.read(".info/CONTENT").decode().splitlines()
    assert len(manifest) == len(names) and all(len(line.split(",")) == 3 for line in manifest)


def test_pyproject_selects_the_packages_as_the_deployments_do():
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["fab-include"] == FAB_INCLUDE
    assert "fab-exclude" not in app
    assert set(app["components"].values()) == {f"{m}:{m.rsplit('.', 1)[1]}" for m in COMPONENTS}


def test_docs_state_the_measured_bundle(fab):
    """docs/running.md says how many files the bundle holds (exactly) and its size (within 10 %)."""
    text = (ROOT / "docs" / "running.md").read_text()
    stated = re.search(r"the app bundle[^*]*\*\*(\d+) files, (\d+) KiB\*\*", text)
    assert stated, "docs/running.md states no '**N files, K KiB**' of the app bundle"
    assert int(stated.group(1)) == len(contents(fab)), describe(fab)
    assert abs(int(stated.group(2)) - len(fab) / 1024) <= 0.1 * len(fab) / 1024, describe(fab)


def test_bundle_command_prints_one_line_and_refuses_a_directory_without_an_app(fab, tmp_path, capsys):
    assert main([str(ROOT)]) == 0
    assert capsys.readouterr().out.strip() == describe(fab)
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"fedpers: error: {tmp_path} holds no pyproject.toml: not a "
                                               "Flower app directory")


def test_deploy_local_submits_the_bundle_of_the_repository(fab, tmp_path):
    """`fedpers deploy local` runs `flwr run` of an app directory with the run's config: its bundle holds
    the same files, byte for byte, as the repository's; only pyproject.toml (the run-config) differs."""
    cfg = build_config(tiny_overrides(out_dir=str(tmp_path / "out")))
    app = write_app_dir(cfg, tmp_path / "app", code=True)
    deployed, here = contents(build(app)), contents(fab)
    assert deployed.pop("pyproject.toml") != here.pop("pyproject.toml")
    assert deployed == here


def test_the_installed_bundle_alone_holds_what_the_app_imports(fab, tmp_path):
    """Installed as a SuperLink or SuperNode installs it (first on sys.path), the bundle's own files are
    every module the ServerApp, the ClientApp and every method's classes load: none comes from elsewhere."""
    from flwr.cli.install import install_from_fab

    installed = install_from_fab(fab, install_dir=tmp_path, skip_prompt=True)
    script = f"""
import sys
sys.path.insert(0, {str(installed)!r})
import fedpers.apps.server_app, fedpers.apps.client_app
from fedpers.registry.methods import EXTENSIONS, METHODS, _import
for spec in METHODS.values():
    spec.strategy_class(), spec.client_class(), spec.own_keys()
for ext in EXTENSIONS:
    _import(ext.strategy_wrapper), _import(ext.client_wrapper), ext.own_keys()
outside = sorted(name for name, module in list(sys.modules.items()) if name.split(".")[0] in {APP_PACKAGES!r}
                 and getattr(module, "__file__", None) and not module.__file__.startswith({str(installed)!r}))
print("outside:", outside)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "outside: []" in res.stdout, res.stdout


# ---------------------------------------------------------------------------------------------------------
# flwr run . local
# ---------------------------------------------------------------------------------------------------------
RUN_CONFIG = {"method": "pfedkdh", "num_clients": 3, "rounds": 2, "dataset": "digits", "aux_size": 100,
              "device": "cpu"}
# what a run record holds that is not the experiment's outcome: its timing and Flower's random node ids
NOT_COMPARED = {"round_seconds", "fit_nodes"}


def _managed_superlinks(flwr_home: Path) -> list[int]:
    """PIDs of the `flower-superlink` that `flwr run . local` started for ``flwr_home`` (it outlives the
    command, as docs/running.md says), found by its log file under that home."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("flower-superlink") for a in argv[:2]) and any(str(flwr_home) in a for a in argv):
            found.append(int(entry.name))
    return found


def _stop(pids: list[int]) -> None:
    """SIGTERM ``pids`` and their descendants, SIGKILL what is left after 10 s."""
    tree = pids + [child for pid in pids for child in descendants(pid)]
    signal_pids(tree, signal.SIGTERM)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(Path(f"/proc/{pid}").exists() for pid in tree):
        time.sleep(0.2)
    signal_pids(tree, signal.SIGKILL)


def _round_records(out: Path) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in NOT_COMPARED} for record in read_metrics(out)]


@pytest.mark.simulation
def test_flwr_run_local_from_the_repository_gives_the_metrics_of_fedpers_run(tmp_path):
    """docs/running.md's promise: `flwr run . local` (Flower's managed local SuperLink, the app bundle built
    from this repository, which holds the committed results, installed and run by Flower's simulation) and
    `fedpers run` with the same config and seed give identical metrics."""
    home, native, ours = tmp_path / "flwr_home", tmp_path / "flwr_run", tmp_path / "fedpers_run"
    env = flower_env(home, {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
                            "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
                            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    env.pop("PYTHONPATH", None)  # the bundle's code runs, installed by Flower, not this checkout's path
    run_config = " ".join(f"{k}={json.dumps(v)}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in {**RUN_CONFIG, "out_dir": str(native)}.items())
    try:
        res = subprocess.run([str(Path(sys.executable).parent / "flwr"), "run", ".", "local", "--stream",
                              "--federation-config", f"num-supernodes={RUN_CONFIG['num_clients']}",
                              "--run-config", run_config], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        _stop(_managed_superlinks(home))
    log = res.stdout + res.stderr
    assert (native / "summary.json").is_file(), log[-4000:]
    assert "Exit Code" not in log and "Traceback" not in log, log[-4000:]

    sets = [a for k, v in {**RUN_CONFIG, "out_dir": str(ours)}.items() for a in ("--set", f"{k}={v}")]
    cli = subprocess.run([sys.executable, "-m", "fedpers", "run", "configs/quickstart.yaml", *sets], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]

    configs = [{k: v for k, v in read_summary(out)["config"].items() if k != "out_dir"} for out in (native, ours)]
    assert configs[0] == configs[1]  # the pyproject table is configs/quickstart.yaml over the defaults
    native_rounds, our_rounds = _round_records(native), _round_records(ours)
    assert [r["round"] for r in native_rounds] == [1, 2]
    assert native_rounds[-1]["personalized_macro_acc"] is not None
    assert native_rounds == our_rounds  # every accuracy, per client too, exactly
