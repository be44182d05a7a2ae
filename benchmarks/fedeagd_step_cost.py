"""What one local SGD step of FedEAGD costs against FedPer on the same SE-CNN.

A step of FedPer: forward of the SE-CNN, cross-entropy, backward, SGD. A step of FedEAGD with its teacher
adds the EMA teacher's forward (no gradient), the drift and the weighted distillation; its drift needs the
student's eval-mode features. Those once came from a second pass of the whole extractor
(``eval_mode_features``); now the convolutions run once and only the layers after the dropout run twice
(``fedpers.core.training.features_in_both_modes``). And the teacher, frozen for the round, once ran on every
batch of every epoch; now the client computes its features of every sample once a round
(``FedEAGDClient.train``), so a step only looks them up (``fedeagd_teacher_once``) and the round adds one
eval-mode teacher pass over the data, timed here per 64 samples (``teacher pass, per 64 samples``): at E
local epochs FedEAGD's step costs ``fedeagd_teacher_once`` plus that pass over E. All are timed on
CIFAR-10-shaped batches (3x32x32, batch 64, feature_dim 512), one thread as a Ray client actor has,
interleaved (A, B, C, ...) so that a change of load on the machine touches all alike; medians over the
repetitions.

    python benchmarks/fedeagd_step_cost.py --repeats 7 --steps 10

Writes benchmarks/results/fedeagd_step_cost.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.algorithms.fedeagd import fedeagd_coefficients, historical_distillation
from fedpers.core.models import build_model
from fedpers.core.training import backbone_features, eval_mode_features, features_in_both_modes, frozen_copy, sgd

OUT = Path(__file__).resolve().parent / "results"


def make_step(kind: str, model, teacher, opt, x):
    """One SGD step of ``kind``: fedper, fedeagd_two_passes (the first), fedeagd_one_trunk (the teacher on
    every batch) or fedeagd_teacher_once (now: the teacher's features of the batch looked up); or the
    teacher's eval-mode pass over 64 samples (``teacher pass``)."""
    once = backbone_features(teacher, x)

    def step(x, y):
        if kind == "teacher pass":
            backbone_features(teacher, x)
            return
        opt.zero_grad(set_to_none=True)
        if kind == "fedper":
            loss = F.cross_entropy(model(x), y)
        else:
            if kind == "fedeagd_two_passes":
                z = model.backbone(x)
                z_matched = eval_mode_features(model.backbone, x)
            else:
                z, z_matched = features_in_both_modes(model.backbone, x)
            loss = F.cross_entropy(model.classify(z), y)
            if kind == "fedeagd_teacher_once":
                t = once
            else:
                with torch.no_grad():
                    t = teacher.backbone(x)
            _, coef = fedeagd_coefficients(z_matched, t, adaptive=True, base=0.5, upper=1.0, fixed=0.5)
            loss = loss + historical_distillation(z, t, coef, "cosine")
        loss.backward()
        opt.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)
    kinds = ["fedper", "fedeagd_two_passes", "fedeagd_one_trunk", "fedeagd_teacher_once", "teacher pass"]
    steps = {}
    for kind in kinds:
        model = build_model((3, 32, 32), 10, feature_dim=512, seed=0, kind="se_cnn")
        model.train()
        steps[kind] = make_step(kind, model, frozen_copy(model), sgd(model.parameters(), 0.015), x)
        steps[kind](x, y)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for kind in kinds:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[kind](x, y)
            times[kind].append((time.perf_counter() - start) / args.steps)
    median = {k: float(np.median(v)) for k, v in times.items()}
    result = {"batch": 64, "input": [3, 32, 32], "feature_dim": 512, "threads": 1, "repeats": args.repeats,
              "steps_per_repeat": args.steps, "seconds_per_step_median": median,
              "ratio_to_fedper": {k: median[k] / median["fedper"] for k in kinds}, "all": times}
    OUT.mkdir(exist_ok=True)
    (OUT / "fedeagd_step_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# One local SGD step: FedEAGD against FedPer on the SE-CNN (benchmarks/fedeagd_step_cost.py)", "",
             f"`python benchmarks/fedeagd_step_cost.py --repeats {args.repeats} --steps {args.steps}`: CIFAR-10-shaped "
             "batches of 64, feature_dim 512, one thread, interleaved; medians.", "",
             "| step | s/step (median) | x FedPer |", "|---|---|---|"]
    for k in kinds:
        lines.append(f"| {k} | {median[k]:.4f} | {median[k] / median['fedper']:.2f} |")
    once, teacher = median["fedeagd_teacher_once"], median["teacher pass"]
    lines += ["", "FedEAGD's step with the teacher's pass spread over a round of E local epochs "
              "(fedeagd_teacher_once + teacher pass / E), against the teacher on every batch:", "",
              "| local epochs | s/step, teacher once a round | x FedPer | teacher on every batch, x FedPer |",
              "|---|---|---|---|"]
    for epochs in (1, 5):
        per_step = once + teacher / epochs
        lines.append(f"| {epochs} | {per_step:.4f} | {per_step / median['fedper']:.2f} | "
                     f"{median['fedeagd_one_trunk'] / median['fedper']:.2f} |")
    text = "\n".join(lines) + "\n"
    (OUT / "fedeagd_step_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
