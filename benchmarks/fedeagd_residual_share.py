"""How much FedEAGD's personalized residual changes each client's model at the end of a run.

For a finished FedEAGD run directory of an image dataset: the server checkpoint's shared
extractor theta_g, each client's persistent residual r_k and head h_k (its client state), and the client's
own test split (the run's ``partition.npz``). Per client it prints the mean ratio ||alpha r_k(z)|| / ||z||
with z = theta_g(x) and alpha the gate of the checkpointed round, and the share of its test samples whose
prediction h_k(z + alpha r_k(z)) differs from h_k(z), i.e. what switching the residual off would change.
Writes the figures as JSON. Needs the run's checkpoint and client_state, which studies do not commit.

    python benchmarks/fedeagd_residual_share.py RUN_DIR --data ../shared/data/mnist.npz --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpers.algorithms.fedeagd import fusion_coefficient  # noqa: E402
from fedpers.core.data import load_npz  # noqa: E402
from fedpers.core.models import build_model, set_arrays  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="the run's dataset as .npz")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (refused if it exists)")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"fedeagd_residual_share: {args.out} exists; results are never overwritten")
    summary = args.run_dir / "summary.json"
    if not summary.is_file():
        sys.exit(f"fedeagd_residual_share: {summary} does not exist; the run has not finished")
    cfg = json.loads(summary.read_text())["config"]
    if cfg["method"] != "fedeagd":
        sys.exit(f"fedeagd_residual_share: {args.run_dir} is a {cfg['method']} run, not fedeagd")
    checkpoint = np.load(args.run_dir / "checkpoint" / "server_checkpoint.npz")
    partition = np.load(args.run_dir / "partition.npz")
    data = load_npz(args.data)
    model = build_model(data.x_train.shape[1:], data.num_classes, feature_dim=cfg["feature_dim"],
                        kind="se_cnn")
    state = model.state_dict()
    for name in state:
        if name.startswith("backbone.") and f"model/{name}" in checkpoint.files:
            state[name] = torch.tensor(checkpoint[f"model/{name}"])
    model.load_state_dict(state)
    model.eval()
    rounds = cfg["rounds"]
    alpha = fusion_coefficient(rounds, cfg["fedeagd_fusion_start"], cfg["fedeagd_fusion_ramp"], cfg["fedeagd_fusion"])
    clients = {}
    for c in range(cfg["num_clients"]):
        personal = np.load(args.run_dir / "client_state" / f"partition-{c}" / "personal.npz")
        set_arrays(model, [personal[f"a{i:04d}"] for i in range(len(personal.files) - 1)], "personal",
                   source=f"client {c}: personal state")
        x = torch.tensor(data.x_test[partition[f"test_{c}"]])
        with torch.no_grad():
            z = model.backbone(x)
            shift = alpha * model.residual(z)
            ratio = float((shift.norm(dim=1) / z.norm(dim=1).clamp_min(1e-12)).mean())
            changed = float((model.head(z).argmax(1) != model.head(z + shift).argmax(1)).float().mean())
        clients[str(c)] = {"test_samples": len(x), "residual_to_feature_norm": ratio,
                           "predictions_changed": changed}
        print(f"client {c:2d}: {len(x):5d} test samples, ||alpha r(z)||/||z|| {ratio:.4f}, "
              f"predictions changed by the residual {100 * changed:.2f} %")
    ratios = [v["residual_to_feature_norm"] for v in clients.values()]
    changed = [v["predictions_changed"] for v in clients.values()]
    result = {"run_dir": str(args.run_dir), "round": rounds, "alpha": alpha, "clients": clients,
              "mean_ratio": float(np.mean(ratios)), "max_ratio": float(np.max(ratios)),
              "mean_predictions_changed": float(np.mean(changed)), "max_predictions_changed": float(np.max(changed))}
    print(f"gate alpha {alpha:g}; mean ratio {result['mean_ratio']:.4f} (max {result['max_ratio']:.4f}); "
          f"predictions changed: mean {100 * result['mean_predictions_changed']:.2f} %, "
          f"max {100 * result['max_predictions_changed']:.2f} %")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
