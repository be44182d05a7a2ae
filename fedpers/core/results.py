"""The one results format: ``metrics.jsonl`` (one JSON line per round) and ``summary.json``.

``metrics.jsonl`` is appended and flushed after every round, so a crash keeps every finished round.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from fedpers.core.wire import VALIDATION_PREFIX

# The accuracies people compare, each per round in metrics.jsonl and summarised in summary.json:
# global_acc (the shared model on the union of the test splits), personalized_macro_acc (each client's own
# model on its own test split, equal weight per client: the pFedKDH paper's) and personalized_weighted_acc
# (the same, weighted by test samples: PFLlib's and FL-bench's), plus method variants (..._fair, ...).
# With a validation split (config key val_fraction) each evaluated round also records the same accuracies of
# the clients' models on their validation splits, under the same names after VALIDATION_PREFIX
# (val_personalized_macro_acc, val_personalized_macro_acc_fair, val_per_client_acc, ...): values are chosen
# on those. Shared-model methods have no separate validation global accuracy: their clients evaluate the
# global model on their own validation splits (val_personalized_macro_acc).
ACCURACY_PREFIXES = ("global_acc", "personalized_macro_acc", "personalized_weighted_acc",
                     VALIDATION_PREFIX + "personalized_macro_acc")
LAST_ROUNDS = 5

ROUND_FIELDS = ("round", "global_acc", "personalized_macro_acc", "per_client_acc", "train_loss",
                "bytes_up", "bytes_down", "round_seconds")


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/Inf become null, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def accuracy_summary(history: list[dict[str, Any]], last: int = LAST_ROUNDS) -> dict[str, Any]:
    """For every accuracy of the round records (:data:`ACCURACY_PREFIXES`): the best value over the evaluated
    rounds and its round (the earliest on ties), and the mean of the last ``last`` evaluated rounds."""
    keys = sorted({k for r in history for k in r if k.startswith(ACCURACY_PREFIXES)})
    best, best_round, tail = {}, {}, {}
    for key in keys:
        points = [(r["round"], float(r[key])) for r in history
                  if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
                  and math.isfinite(r[key])]
        if not points:
            continue
        rnd, value = max(points, key=lambda p: (p[1], -p[0]))
        best[key], best_round[key] = value, rnd
        tail[key] = sum(v for _, v in points[-last:]) / len(points[-last:])
    return {"best": best, "best_round": best_round, f"mean_last_{last}_evaluated": tail}


class ResultsWriter:
    """Writes one run's results into ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, tensorboard: bool = False, *, wandb: str = "off",
                 wandb_project: str = "fedpers", config: dict[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
        self.wandb_run = None
        if wandb != "off":
            self.wandb_run = _start_wandb(self.out_dir, wandb, wandb_project, config or {})
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self.metrics_path.write_text("")  # a new run starts a new file
        if self.summary_path.exists():
            self.summary_path.unlink()

    def append_round(self, record: dict[str, Any]) -> None:
        """Append one round's record and flush it to disk."""
        missing = [f for f in ROUND_FIELDS if f not in record]
        if missing:
            raise ValueError(f"round record lacks {missing}")
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(_clean(record), sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {key: value for key, value in record.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round"
                   and math.isfinite(value)}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, global_step=record["round"])
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=int(record["round"]))

    def write_summary(self, summary: dict[str, Any], history: list[dict[str, Any]] | None = None) -> None:
        """Write ``summary.json`` atomically, and with ``history`` the accuracy curves ``curves.png``."""
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_clean(summary), indent=2) + "\n")
        os.replace(tmp, self.summary_path)
        if self.wandb_run is not None:
            for key, value in _clean(summary).items():
                if key != "config":
                    self.wandb_run.summary[key] = value
            self.wandb_run.finish()
            # finish() returns once the exit record is handed over; the wandb service may still hold the
            # run file's last records in its buffer (CI saw a file of only its header). teardown waits for the
            # service to close the run, so the file under OUT/wandb is whole when summary.json is written
            wandb_module().teardown()
            self.wandb_run = None
        if history:
            from fedpers.core.run_figures import curves_png

            try:
                curves_png(history, self.out_dir / "curves.png", ACCURACY_PREFIXES,
                           title=f"{summary.get('method', '')} on {Path(str(summary.get('dataset', ''))).name}")
            except OSError as exc:  # a full disk: the figure is lost, the run's numbers are not (written above)
                (self.out_dir / "curves.png").unlink(missing_ok=True)
                print(f"fedpers: warning: could not write {self.out_dir / 'curves.png'} ({exc.strerror or exc}); "
                      "metrics.jsonl and summary.json are whole", file=sys.stderr, flush=True)


def wandb_module():
    """The wandb package, or a ConfigError naming the optional extra that provides it."""
    try:
        import wandb
    except ImportError:
        from fedpers.core.errors import ConfigError

        raise ConfigError("config key 'wandb': needs the wandb package: pip install 'fedpers[wandb]'") from None
    return wandb


def _start_wandb(out_dir: Path, mode: str, project: str, config: dict[str, Any]):
    """A Weights & Biases run writing into ``out_dir/wandb`` (``offline``: no network, sync later)."""
    wandb = wandb_module()
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(project=project, mode=mode, dir=str(out_dir), config=config,
                      name=f"{config.get('method', 'run')}-{out_dir.name}", reinit="finish_previous")


def machine_environment() -> dict[str, Any]:
    """Where a run's numbers were computed: the versions of Python, torch, Flower and NumPy, the CPU, the
    vector kernels torch chose for it (``torch.backends.cpu.get_cpu_capability()``), torch's intra-op
    threads and the GPU if one is used. Not a paper's equation: two runs of the same arithmetic on
    machines whose kernels or thread counts differ sum in another order and part in their last digits
    (then, over rounds, by a few hundredths of a point), and this says which machines two runs had."""
    import platform

    import flwr
    import numpy
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:  # not Linux
        pass
    return {"python": platform.python_version(), "torch": torch.__version__, "flwr": flwr.__version__,
            "numpy": numpy.__version__, "cpu": cpu, "cpu_count": os.cpu_count(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def read_metrics(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All round records of a run."""
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_summary(out_dir: str | os.PathLike) -> dict[str, Any]:
    """A run's summary."""
    return json.loads((Path(out_dir) / "summary.json").read_text())
