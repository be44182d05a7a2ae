"""Named seed streams. Every random draw of a run is seeded by the run's ``seed`` and the coordinates of
the draw (round, partition id) plus one of these stream numbers, so that two draws never share a stream
and a draw does not move when another is added. The numbers are fixed: changing one changes results.

Client-side streams are the last part of ``(seed, round, partition id, stream)``; server-side draws use
``(seed, SERVER_TRAINING, step)``, apart from every client's.
"""

from __future__ import annotations

import numpy as np

CLIENT_FIT = 1  # local training's shuffling and dropout (every method)
CLIENT_EVALUATE = 2  # evaluation-time adaptation (pFedKDH-EA head steps, FedBABU fine-tuning, ...)
FEDAS_ALIGNMENT = 3  # FedAS parameter alignment's shuffling
JDFL_RANDOM_TARGETS = 3  # JDFL random targets; shares FedAS's number, JDFL never wraps FedAS
JDFL_DISCOVERY = 4  # JDFL discovery round's local epochs
FEDFED_DISTILLER_INIT = 5  # FedFed's distiller initialisation, (seed, partition id, stream): no round
FEDFED_FEATURE_NOISE = 6  # FedFed's noise on the shared performance-sensitive features
FEDFED_SHARED_DRAW = 7  # the server's draw of shared samples sent to a client, (seed, round, pid, stream)
VALIDATION_SPLIT = 8  # the draw of each client's validation split, (seed, stream): drawn once per run
SERVER_TRAINING = 10**6  # server-side training (pFedKDH warm-up and recalibration): no client reaches it
EVALUATION_SAMPLE = 10**6 + 1  # the clients evaluated in a round (eval_clients), (seed, stream, round)
# Synthetic(alpha, beta) (fedpers/core/synthetic.py): every client's data is generated on demand from a stream
# of its own, so that any process generates the same client without generating the others. Numbers above
# 10**6, as the server's: (seed, stream, k) never meets a (seed, partition id, stream) or (seed, round, ...) one
SYNTHETIC_SIZES = 10**6 + 2  # the number of samples of every client, (seed, stream): one O(K) vector
SYNTHETIC_CLIENT = 10**6 + 3  # client k's model (u_k, B_k, W_k, b_k, v_k) and samples, (seed, stream, k)
SYNTHETIC_IID_MODEL = 10**6 + 4  # the one (W, b) all clients share in the iid variant, (seed, stream)
SYNTHETIC_TEST_CLIENTS = 10**6 + 5  # the clients whose test splits form the global test set, (seed, stream)
SYNTHETIC_AUX = 10**6 + 6  # the server's set Ds: each sample's client and its draw, (seed, stream)
JDFL_HEAD_OFFSET = 7919  # seed + this initialises JDFL's expanded head (server and clients agree)


def derived_seed(*parts: int) -> int:
    """One 32-bit seed from the parts of a stream (numpy's SeedSequence, order-sensitive)."""
    return int(np.random.SeedSequence([abs(int(p)) for p in parts]).generate_state(1)[0])
