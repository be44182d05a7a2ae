"""Class prototypes shared by FedProto (Tan et al., AAAI 2022) and FedProc (Mu et al., FGCS 2023):
the per-class mean backbone feature of a client and the count-weighted server average.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def class_prototypes(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """FedProto local prototypes (Eq. 4; our equation numbers other than Eq. 8 are from memory):
    ``C_i^(j) = 1/|D_i,j| sum_{(x,y) in D_i,j} f_i(x)``, the mean backbone feature of every class j on
    client i's data (zeros for classes it does not hold), and the class counts ``|D_i,j|`` (float32, as
    every uploaded array)."""
    feats = features.detach().double()
    sums = torch.zeros(num_classes, feats.shape[1], dtype=torch.float64, device=feats.device)
    sums.index_add_(0, y, feats)
    counts = torch.bincount(y, minlength=num_classes).double()
    protos = sums / counts.clamp_min(1.0)[:, None]
    return protos.float().cpu().numpy(), counts.float().cpu().numpy()


def aggregate_prototypes(local: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """FedProto global prototypes (Eq. 6): ``C_bar^(j) = sum_{i in N_j} |D_i,j| C_i^(j) / sum_{i in N_j}
    |D_i,j|``, the count-weighted mean over the clients N_j that hold class j, computed in float64.

    Returns (prototypes C x d, availability mask C: 1 where some client reported the class this round).
    As FedProto's code, the global prototypes are rebuilt from each round's uploads only; a class that no
    uploading client holds has no global prototype that round (mask 0, zeros)."""
    if not local:
        raise ValueError("no prototypes to aggregate")
    num = np.zeros(np.shape(local[0][0]), dtype=np.float64)
    den = np.zeros(len(num), dtype=np.float64)
    for protos, counts in local:
        counts = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
        num += np.asarray(protos, dtype=np.float64) * counts[:, None]
        den += counts
    seen = den > 0
    out = np.zeros_like(num)
    out[seen] = num[seen] / den[seen, None]
    return out.astype(np.float32), seen.astype(np.float32)
