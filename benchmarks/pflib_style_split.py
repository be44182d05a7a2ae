"""Write a PFLlib-style client split as a fedpers ``partition.npz`` (``index_space: joined``).

PFLlib's generators pool train and test (70,000 MNIST images), give each client a Dirichlet(alpha)
share of every class, then cut each client's samples 75/25 into train/test. This script does the same
with indices, so that ``partition: file`` runs fedpers on such a split:

    python benchmarks/pflib_style_split.py --data ../shared/data/mnist.npz --clients 20 --alpha 0.1 \
        --out /tmp/pflib_mnist.npz
    fedpers run --set dataset=../shared/data/mnist.npz --set partition=file \
        --set partition_file=/tmp/pflib_mnist.npz --set method=fedavg --out results/pflib_fedavg
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def pflib_style(labels: np.ndarray, clients: int, alpha: float, train_share: float, seed: int,
                min_size: int = 10) -> dict[str, np.ndarray]:
    """Dirichlet-by-class split of all samples, then a per-client train/test cut."""
    rng = np.random.default_rng(seed)
    classes = int(labels.max()) + 1
    while True:
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in range(classes):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(map(len, parts)) >= min_size:
            break
    out: dict[str, np.ndarray] = {}
    for k, part in enumerate(parts):
        part = rng.permutation(np.array(part, dtype=np.int64))
        cut = int(train_share * len(part))
        out[f"train_{k}"], out[f"test_{k}"] = np.sort(part[:cut]), np.sort(part[cut:])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="Keras-layout .npz")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--train-share", type=float, default=0.75)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with np.load(args.data) as f:
        labels = np.concatenate([f["y_train"], f["y_test"]]).astype(np.int64)
    arrays = pflib_style(labels, args.clients, args.alpha, args.train_share, args.seed)
    np.savez(args.out, **arrays, aux=np.zeros(0, np.int64), index_space=np.array("joined"),
             dataset=np.array(Path(args.data).name), num_samples=np.array(len(labels), dtype=np.int64))
    sizes = [len(arrays[f"train_{k}"]) for k in range(args.clients)]
    print(f"wrote {args.out}: {args.clients} clients, {len(labels)} samples, train sizes {min(sizes)}-{max(sizes)}")


if __name__ == "__main__":
    main()
