"""pFedSim (Tan et al., arXiv:2305.15706): classifier similarity and the aggregation weights of a
client's personalized feature extractor; the FedAvg warm-up length.
"""

from __future__ import annotations

import numpy as np

from fedpers.core.schema import Key, unit_interval_open_right


# pFedSim's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("pfedsim_warmup", float, 0.5,
        "pFedSim share of rounds in the FedAvg warm-up phase before personalization (paper code: 0.5)",
        unit_interval_open_right),
)


def classifier_similarity(w_i: np.ndarray, w_j: np.ndarray) -> float:
    """pFedSim client similarity: the cosine similarity of two clients' classifier weights, row by row
    (one row per class), averaged over classes and floored at 0:
    ``s_ij = max(0, 1/C sum_c cos(W_i[c], W_j[c]))`` (as the authors' code in FL-bench)."""
    a = np.asarray(w_i, dtype=np.float64).reshape(len(w_i), -1)
    b = np.asarray(w_j, dtype=np.float64).reshape(len(w_j), -1)
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    cos = np.sum(a * b, axis=1) / np.maximum(na * nb, 1e-12)
    return float(max(0.0, cos.mean()))


def pfedsim_weights(similarity_row: np.ndarray, self_index: int, self_similarity: float = 0.9999) -> np.ndarray:
    """pFedSim aggregation weights of client k's personalized feature extractor from row k of the
    similarity matrix (identity at start, entries s_kj in [0, 1]).

    As the authors' code (FL-bench ``pFedSimServer.generate_client_params``): when client k has no
    positive similarity to anybody yet (row sum <= 1), it keeps its own extractor (one-hot weights);
    otherwise ``s_kk <- 0.9999``, ``w_kj = -log(1 - s_kj)``, normalised to sum 1. ``-log(1 - s)`` grows
    without bound as s -> 1, so the most similar clients dominate and dissimilar ones (s = 0) get 0."""
    row = np.clip(np.asarray(similarity_row, dtype=np.float64), 0.0, 1.0)
    out = np.zeros_like(row)
    if row.sum() <= 1.0:
        out[self_index] = 1.0
        return out
    row = row.copy()
    row[self_index] = self_similarity
    w = -np.log(np.clip(1.0 - row, 1e-12, None))
    return w / w.sum()


def warmup_rounds(cfg) -> int:
    """W = int(pfedsim_warmup x rounds): rounds 1..W are FedAvg warm-up."""
    return int(cfg.rounds * cfg.pfedsim_warmup)
