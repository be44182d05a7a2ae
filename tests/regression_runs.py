"""The short digits runs whose ``metrics.jsonl`` are the refactoring safety net (``tests/fixtures/regression``).

``python -m tests.regression_runs`` (re)records them; ``tests/test_regression.py`` re-runs them and compares.
Record only when a change is *meant* to change a method's numbers, and say so in the commit.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "regression"
# timing and host fields: they differ between two runs of the same arithmetic
VOLATILE_KEYS = ("fit_nodes",)
VOLATILE_SUFFIX = "_seconds"
# Intra-op threads of the recordings: torch splits a reduction by thread, so another count sums in another
# order, and pFedMe's round 2 on 1 thread differs from the recording by 0.8 points (OMP_NUM_THREADS=1).
RECORDED_THREADS = 2
JDFL_RUNS = (("fedavg", "graded"), ("scaffold", "graded"))


def run_names() -> list[str]:
    """Every registered method, then JDFL over a few of its base optimizers (``jdfl-<mode>-<base>``)."""
    from fedpers.registry.methods import METHODS

    return sorted(METHODS) + [f"jdfl-{mode}-{base}" for base, mode in JDFL_RUNS]


def overrides_of(name: str, out_dir: Path, **keys) -> dict:
    """The config of run ``name``: ``tests.conftest.tiny_overrides`` (digits, 3 clients, 2 rounds; the
    recordings send every evaluation in an evaluate message of its own), with ``keys`` on top."""
    from tests.conftest import tiny_overrides

    if name.startswith("jdfl-"):
        _, mode, base = name.split("-")
        extra = dict(method=base, jdfl=mode, dataset="digits_domains", partition="domain", aux_size=0,
                     num_clients=3, model_kind="gn_cnn", feature_dim=32, jdfl_discovery_epochs=1)
    else:
        extra = dict(method=name, variant="ea")
    return tiny_overrides(**{"fraction_fit": 0.67, "out_dir": str(out_dir), "evaluate_with_next_fit": False, **extra, **keys})


def run(name: str, out_dir: Path, **keys) -> list[dict]:
    """Run ``name`` (config keys ``keys`` on top) in process, on the recordings' ``RECORDED_THREADS`` intra-op
    threads whatever the environment sets, and return its rounds without the volatile fields."""
    from fedpers.registry.config import build_config
    from fedpers.apps.inprocess import run_in_process
    from fedpers.core.results import read_metrics
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(RECORDED_THREADS)
    try:
        run_in_process(build_config(overrides_of(name, out_dir, **keys)))
    finally:
        torch.set_num_threads(threads)
    return [{k: v for k, v in r.items() if k not in VOLATILE_KEYS and not k.endswith(VOLATILE_SUFFIX)} for r in read_metrics(out_dir)]


def record(names: list[str]) -> None:
    """Write ``FIXTURES/<name>.jsonl`` for every name."""
    import json
    import tempfile

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in names:
        tmp = Path(tempfile.mkdtemp(prefix=f"regression-{name}-"))
        try:
            rounds = run(name, tmp / "run")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        (FIXTURES / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rounds))
        print("recorded", name, flush=True)


if __name__ == "__main__":
    record(sys.argv[1:] or run_names())
