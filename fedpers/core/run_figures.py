"""The figures every run leaves in its out dir (matplotlib, Agg backend; skipped with a log line where
matplotlib is not installed):

* ``partition.png`` next to ``partition.npz``: one row per client, one column per class, each cell the
  client's number of training samples of that class (the split at a glance, as
  ``flwr_datasets.visualization.plot_label_distributions`` or FL-bench's ``-pd`` draw it);
* ``curves.png``: every accuracy of the round records against the round.
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        from flwr.common import log

        log(WARNING, "fedpers: matplotlib is not installed: no figures (pip install 'fedpers[plot]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_distribution_png(counts: dict[str, dict[str, list[int]]], path: str | Path,
                           class_names: list[str] | None = None) -> Path | None:
    """``counts`` (client -> {"train": per-class counts, ...}) as a clients x classes count matrix."""
    plt = _pyplot()
    if plt is None:
        return None
    clients = sorted(counts, key=int)
    matrix = np.array([counts[c]["train"] for c in clients])
    k, c = matrix.shape
    fig, ax = plt.subplots(figsize=(min(14.0, max(4.0, 0.5 * c + 2)), min(12.0, max(2.5, 0.28 * k + 1.2))))
    image = ax.imshow(matrix, aspect="auto", cmap="Blues")
    if k * c <= 400:  # numbers stay legible
        for i in range(k):
            for j in range(c):
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=6,
                        color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    ax.set_xticks(range(c), class_names or [str(j) for j in range(c)], fontsize=7, rotation=90 if c > 12 else 0)
    if k <= 60:
        ax.set_yticks(range(k), [f"client {cl}" for cl in clients], fontsize=7)
    else:
        ax.set_ylabel("client")
    ax.set(xlabel="class", title="training samples per client and class")
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def curves_png(history: list[dict[str, Any]], path: str | Path, accuracy_prefixes: tuple[str, ...],
               title: str = "") -> Path | None:
    """Each accuracy of the round records (the keys starting with one of ``accuracy_prefixes``: global,
    personalized macro / weighted and variants) vs round."""
    plt = _pyplot()
    if plt is None:
        return None
    keys = sorted({k for r in history for k in r if k.startswith(accuracy_prefixes) and "_domain_" not in k})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key in keys:
        points = [(r["round"], 100.0 * r[key]) for r in history if isinstance(r.get(key), (int, float))]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=2.5, label=key)
    ax.set(xlabel="communication round", ylabel="accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
