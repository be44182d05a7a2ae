"""What the channels-last layout of CPU image batches saves per training step and per evaluation batch.

``fedpers.core.federation.device_layout`` hands every client its multi-channel images in channels-last
(NHWC) order on the CPU. This times one SGD step (forward, cross-entropy, backward, SGD) and one
evaluation batch (no gradient, eval mode) of each model on the shapes our studies use, with the same model
and the same batch in the two layouts: channels-first (as the data were before) and channels-last (now).
The two layouts alternate (A, B, A, B, ...) so that a change of load on the machine touches both alike;
medians over the repetitions; one thread (a Ray client actor's ``client_cpus`` 1) and two (the in-process
engine on this 2-core machine).

    python benchmarks/memory_format.py --repeats 9 --steps 5

Writes benchmarks/results/memory_format.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.core.federation import device_layout
from fedpers.core.models import build_model
from fedpers.core.training import EVAL_BATCH, sgd

OUT = Path(__file__).resolve().parent / "results"
# (name, model kind, image shape, classes, feature_dim, train batch, lr): the studies' settings
SETTINGS = [
    ("FedAvgCNN, CIFAR-10", "cnn", (3, 32, 32), 10, 512, 10, 0.005),
    ("SE-CNN, CIFAR-100 (FedEAGD)", "se_cnn", (3, 32, 32), 100, 512, 64, 0.015),
    ("GroupNorm CNN, PACS 64x64 (JDFL)", "gn_cnn", (3, 64, 64), 7, 128, 32, 0.01),
    ("GroupNorm CNN, PACS 112x112 (JDFL)", "gn_cnn", (3, 112, 112), 7, 128, 32, 0.01),
]
LAYOUTS = ("channels_first", "channels_last")


def timed_work(kind: str, shape, classes: int, feature_dim: int, batch: int, lr: float, layout: str):
    """The training step and the evaluation batch of one model in ``layout``, as zero-argument callables."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(batch, *shape, generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    x_eval = torch.rand(EVAL_BATCH, *shape, generator=gen)
    if layout == "channels_last":
        x, x_eval = device_layout(x), device_layout(x_eval)
    model = build_model(shape, classes, feature_dim=feature_dim, seed=0, kind=kind)
    opt = sgd(model.parameters(), lr)

    def train_step():
        model.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    @torch.no_grad()
    def eval_batch():
        model.eval()
        model(x_eval)

    return {"train step": train_step, "eval batch": eval_batch}


def measure(threads: int, repeats: int, steps: int) -> list[dict]:
    """Median seconds of each setting's step and evaluation batch in both layouts, at ``threads``."""
    torch.set_num_threads(threads)
    rows = []
    for name, kind, shape, classes, feature_dim, batch, lr in SETTINGS:
        work = {layout: timed_work(kind, shape, classes, feature_dim, batch, lr, layout) for layout in LAYOUTS}
        for what in ("train step", "eval batch"):
            for layout in LAYOUTS:  # warm-up: oneDNN builds its kernels on first use
                work[layout][what]()
            times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            for _ in range(repeats):
                for layout in LAYOUTS:
                    start = time.perf_counter()
                    for _ in range(steps):
                        work[layout][what]()
                    times[layout].append((time.perf_counter() - start) / steps)
            median = {layout: float(np.median(times[layout])) for layout in LAYOUTS}
            rows.append({"setting": name, "input": list(shape), "batch": batch if what == "train step" else EVAL_BATCH,
                         "work": what, "threads": threads, "seconds_median": median,
                         "ratio": median["channels_last"] / median["channels_first"], "all": times})
            print(f"{threads} thread(s) | {name} | {what}: channels-first {median['channels_first'] * 1e3:.1f} ms, "
                  f"channels-last {median['channels_last'] * 1e3:.1f} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    rows = [row for threads in args.threads for row in measure(threads, args.repeats, args.steps)]
    OUT.mkdir(exist_ok=True)
    result = {"torch": torch.__version__, "repeats": args.repeats, "steps_per_repeat": args.steps, "rows": rows}
    (OUT / "memory_format.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Channels-last against channels-first CPU image batches (benchmarks/memory_format.py)", "",
             f"`python benchmarks/memory_format.py --repeats {args.repeats} --steps {args.steps} --threads "
             f"{' '.join(map(str, args.threads))}`: the same model and batch in both layouts, alternating; "
             "medians in ms.", "",
             "| setting | work | threads | channels-first | channels-last | last / first |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        m = r["seconds_median"]
        lines.append(f"| {r['setting']} | {r['work']} (batch {r['batch']}) | {r['threads']} | "
                     f"{m['channels_first'] * 1e3:.1f} | {m['channels_last'] * 1e3:.1f} | {r['ratio']:.2f} |")
    text = "\n".join(lines) + "\n"
    (OUT / "memory_format.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
