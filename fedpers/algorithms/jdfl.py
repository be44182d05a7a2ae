"""JDFL: joint domain-class modelling for federated learning under feature skew (the JDFL paper in
shared/papers), as small pure functions. Section and equation numbers are the paper's; indices are
0-based here (the paper counts from 1).

Phase 1 (Sec. 4.2, discovery): client update vectors u_i = theta_i^{E0} - theta^0 on a layer subset,
l2-normalised, clustered by K-means into M pseudo-domains (assignments z_i, centroids mu_d); M by elbow
or silhouette, or fixed.
Phase 2 (Sec. 4.3, joint head): C class logits become M x C joint logits, unit j(d, c) = d*C + c (Eq. 1).
Targets: graded (Sec. 4.3.1) and randomized (Sec. 4.3.2); loss KL(t || softmax(f(x))) (Sec. 4.4).
Evaluation (Sec. 3, 5.6): class-only prediction ``argmax_j mod C``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.core.schema import Key, positive, non_negative, at_least_one, unit_interval, one_of
from fedpers.core.wire import MODEL_SECTION


# What the discovery message (round 0) and its reply carry, by named section (fedpers.core.wire): theta^0 down,
# the update of the jdfl_layers subset after E0 epochs up. Training rounds use the wrapped optimizer's.
DISCOVERY_BROADCAST: tuple[str, ...] = (MODEL_SECTION,)
DISCOVERY_UPLOAD: tuple[str, ...] = ("discovery_update",)

# JDFL's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("jdfl", str, "off",
        "JDFL on top of the method (fedavg, scaffold, feddyn, feddc, fedproc, moon): off | graded | random | "
        "hard (ablation: expanded head, hard client-fixed joint labels)", one_of("off", "graded", "random", "hard")),
    Key("jdfl_m", int, 0, "JDFL number of pseudo-domains M; 0 = chosen by jdfl_select", non_negative),
    Key("jdfl_select", str, "elbow", "JDFL choice of M when jdfl_m = 0: elbow | silhouette (paper: elbow)",
        one_of("elbow", "silhouette")),
    Key("jdfl_max_m", int, 10, "JDFL cap on M when it is chosen (paper: e.g. 10)", at_least_one),
    Key("jdfl_alpha", float, 0.0,
        "JDFL graded main mass alpha; 0 = paper Sec. 5.5 (0.55 if M <= 5 else 0.45)", unit_interval),
    Key("jdfl_tau", float, 0.1, "JDFL graded temperature tau of the centroid-cosine softmax (paper: 0.1)", positive),
    Key("jdfl_phi", float, 1.0, "JDFL random: mass phi on the drawn joint unit j(d, c) (paper: 1.0)", unit_interval),
    Key("jdfl_discovery_epochs", int, 3, "JDFL discovery local epochs E0 (paper: 3)", at_least_one),
    Key("jdfl_discovery_batch", int, 0, "JDFL discovery batch size; 0 = batch_size", non_negative),
    Key("jdfl_layers", str, "last_conv_head",
        "JDFL discovery update-vector layers: head | last_conv_head (paper) | last_two_conv_head | all",
        one_of("head", "last_conv_head", "last_two_conv_head", "all")),
)

# --- joint indexing ------------------------------------------------------------------------------------


def joint_index(d, c, num_classes: int):
    """Eq. (1): the joint unit of (pseudo-domain d, class c) is ``j(d, c) = d*C + c`` (0-based)."""
    return d * num_classes + c


def class_of_joint(j, num_classes: int):
    """Sec. 3: the class of joint unit ``j`` is ``j mod C`` (the paper's ``((j-1) mod C) + 1``, 1-based)."""
    return j % num_classes


def class_only_predictions(logits: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class-only decoding (Sec. 3): ``argmax_j logits mod C``; equal to the argmax over classes of the
    per-class max over the M units (a max-of-affine scorer). With M = 1, the ordinary argmax."""
    return class_of_joint(logits.argmax(dim=1), num_classes)


@torch.no_grad()
def class_only_accuracy(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    """Fraction of samples whose class-only prediction equals the label (Sec. 5.6)."""
    if len(y) == 0:
        return float("nan")
    return (class_only_predictions(logits, num_classes) == y).float().mean().item()


def per_domain_accuracy(pred: np.ndarray, y: np.ndarray, domains: np.ndarray) -> dict[int, float]:
    """Accuracy on each domain separately (Sec. 5.6, per-domain accuracy)."""
    return {int(d): float((pred[domains == d] == y[domains == d]).mean()) for d in np.unique(domains)}


def default_alpha(num_domains: int) -> float:
    """Sec. 5.5: graded main mass alpha = 0.55 if M <= 5 else 0.45."""
    return 0.55 if num_domains <= 5 else 0.45


def pseudo_domain_of_each_domain(assignments: list[int], true_domains: list[int]) -> dict[int, int]:
    """Each true domain's pseudo-domain: the cluster most of its clients were put in by the discovery (the
    smaller id on a tie). A diagnostic of ours, not the paper's; with ARI 1.0 the domain's only cluster."""
    out = {}
    for t in sorted(set(true_domains)):
        zs = [z for z, d in zip(assignments, true_domains) if d == t]
        out[int(t)] = int(np.bincount(zs).argmax())
    return out


@torch.no_grad()
def joint_head_use(logits: torch.Tensor, y: torch.Tensor, head_weight: torch.Tensor, num_classes: int,
                   test_domains: np.ndarray, own: dict[int, int]) -> dict[str, float]:
    """Does the expanded head act (ours, none of these is the paper's)? For joint logits (N x MC, unit
    j(d, c), Eq. 1), labels, the head's weight (MC x F), each test sample's true domain and each domain's
    pseudo-domain (:func:`pseudo_domain_of_each_domain`):

    ``class_only_acc`` (Sec. 3, the max over the M units per class); ``marginal_acc`` (argmax_c of the class
    marginal sum_d softmax_j(d, c)) and ``decodings_differ`` (share of samples where the two disagree: the
    max-of-affine decision of Sec. 4.3 and Appendix A differs from the marginal only where the units of a
    class disagree); ``top_share`` (mean over samples of max_d p(d, c) / sum_d p(d, c) for the predicted
    class: 1/M when the units score alike, 1 when one unit carries the class); ``unit_cosine`` (mean cosine
    between head rows of one class in two pseudo-domains: 1 for copies); ``own_block`` (share of samples
    whose winning unit is in their domain's pseudo-domain; 1/M by chance) and ``own_block_acc`` (accuracy
    decoding each sample by its own pseudo-domain's C logits alone)."""
    n, mc = logits.shape
    m = mc // num_classes
    p = torch.softmax(logits, dim=1).view(n, m, num_classes)
    pred = class_only_predictions(logits, num_classes)
    marginal = marginal_class_log_probs(logits, num_classes).argmax(dim=1)
    in_class = p[torch.arange(n), :, pred]  # N x M: the predicted class's units
    winning_block = logits.argmax(dim=1) // num_classes
    own_block = torch.as_tensor([own[int(t)] for t in test_domains])
    block_logits = logits.view(n, m, num_classes)[torch.arange(n), own_block]
    w = F.normalize(head_weight.reshape(m, num_classes, -1), dim=2)
    pairs = [(a, b) for a in range(m) for b in range(a + 1, m)]
    cosine = torch.stack([(w[a] * w[b]).sum(dim=1) for a, b in pairs]).mean().item() if pairs else 1.0
    return {"M": m, "class_only_acc": (pred == y).float().mean().item(),
            "marginal_acc": (marginal == y).float().mean().item(),
            "decodings_differ": (pred != marginal).float().mean().item(),
            "top_share": (in_class.max(dim=1).values / in_class.sum(dim=1)).mean().item(),
            "unit_cosine": cosine,
            "own_block": (winning_block == own_block).float().mean().item(),
            "own_block_acc": (block_logits.argmax(dim=1) == y).float().mean().item()}


# --- targets ---------------------------------------------------------------------------------------------


def centroid_similarity_weights(centroids: np.ndarray, tau: float) -> np.ndarray:
    """Sec. 4.3.1 steps 1-2: cosine similarities s_{dd'} = cos(mu_d, mu_d') and, for each d, the weights
    w_{dd'} = exp(s_{dd'}/tau) / sum_{d'' != d} exp(s_{dd''}/tau) over the *other* pseudo-domains
    (w_{dd} = 0). Returns the M x M matrix w (rows sum to 1; an all-zero matrix when M = 1)."""
    mu = np.asarray(centroids, dtype=np.float64)
    m = len(mu)
    if m <= 1:
        return np.zeros((m, m))
    unit = mu / np.maximum(np.linalg.norm(mu, axis=1, keepdims=True), 1e-12)
    logits = unit @ unit.T / tau
    np.fill_diagonal(logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    return w / w.sum(axis=1, keepdims=True)


def graded_domain_row(d: int, weights: np.ndarray, alpha: float) -> np.ndarray:
    """Sec. 4.3.1 step 3: the mass over pseudo-domains of a sample of a client in pseudo-domain d:
    ``alpha`` on d and ``(1 - alpha) w_{dd'}`` on every d' != d. With M = 1 all mass is on d (the target
    is one-hot). The row sums to 1."""
    m = len(weights)
    if m <= 1:
        return np.ones(1)
    row = (1.0 - alpha) * np.asarray(weights[d], dtype=np.float64)
    row[d] = alpha
    return row


def hard_domain_row(d: int, num_domains: int) -> np.ndarray:
    """Expanded-head ablation (Sec. 5.9): all mass on the client's own pseudo-domain (hard joint label)."""
    row = np.zeros(num_domains)
    row[d] = 1.0
    return row


def targets_from_domain_row(y: torch.Tensor, row: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Joint targets t (B x MC) that put ``row[d']`` on ``j(d', y)`` for every d' (graded / hard):
    all mass stays on the true class, spread over its M joint units."""
    m = row.numel()
    t = torch.zeros(len(y), m * num_classes, dtype=row.dtype, device=y.device)
    cols = joint_index(torch.arange(m, device=y.device)[None, :], y[:, None], num_classes)
    t.scatter_(1, cols, row.to(y.device).expand(len(y), m))
    return t


def graded_targets(y: torch.Tensor, d: int, weights: np.ndarray, alpha: float, num_classes: int) -> torch.Tensor:
    """Graded-invariance soft targets t^{(d,c)} (Sec. 4.3.1) for labels ``y`` of a client in pseudo-domain d."""
    row = torch.as_tensor(graded_domain_row(d, weights, alpha), dtype=torch.float32)
    return targets_from_domain_row(y, row, num_classes)


def random_targets(y: torch.Tensor, num_domains: int, phi: float, num_classes: int,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Randomized joint labels (Sec. 4.3.2): per sample a pseudo-domain d ~ Uniform{0..M-1}, mass
    ``phi`` on j(d, y); the rest, ``1 - phi``, spread evenly over the other M - 1 units of class y (ours:
    the paper's default phi = 1 makes this a hard label on the drawn unit). M = 1 gives one-hot targets."""
    m = num_domains
    if m == 1:
        return F.one_hot(y, num_classes).float()
    d = torch.randint(m, (len(y),), generator=generator).to(y.device)
    rest = (1.0 - phi) / (m - 1)
    rows = torch.full((len(y), m), rest, device=y.device)
    rows[torch.arange(len(y), device=y.device), d] = phi
    t = torch.zeros(len(y), m * num_classes, device=y.device)
    cols = joint_index(torch.arange(m, device=y.device)[None, :], y[:, None], num_classes)
    t.scatter_(1, cols, rows)
    return t


def soft_target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sec. 4.4: L_soft = KL(t || softmax(logits)) = sum_j t_j (log t_j - log p_j), averaged over the
    batch (0 log 0 = 0). Equal to cross-entropy up to the constant entropy of t; = CE for one-hot t."""
    log_p = F.log_softmax(logits, dim=1)
    entropy_term = torch.where(targets > 0, targets * torch.log(targets.clamp_min(1e-12)), torch.zeros_like(targets))
    return (entropy_term - targets * log_p).sum(dim=1).mean()


# --- Phase 1: discovery ---------------------------------------------------------------------------------


def normalize_updates(updates: np.ndarray) -> np.ndarray:
    """Sec. 4.2: u_bar_i = u_i / ||u_i||_2 (rows; a zero update stays zero)."""
    u = np.asarray(updates, dtype=np.float64)
    return u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)


def elbow_choice(inertias: dict[int, float]) -> int:
    """Elbow of the K-means inertia curve: the k farthest below the chord from the first to the last
    point, both axes scaled to [0, 1] (the "kneedle" rule; ours: the paper inspects the elbow by eye).
    A flat curve (no gain from more clusters) gives the smallest k."""
    ks = sorted(inertias)
    if len(ks) <= 2:
        return ks[0] if len(ks) == 1 or inertias[ks[0]] - inertias[ks[-1]] <= 1e-12 else ks[-1]
    y = np.array([inertias[k] for k in ks], dtype=np.float64)
    span = y[0] - y[-1]
    if span <= 1e-12 * max(1.0, abs(y[0])):
        return ks[0]
    x = (np.array(ks, dtype=np.float64) - ks[0]) / (ks[-1] - ks[0])
    yn = (y - y[-1]) / span  # 1 at k_min, 0 at k_max
    chord = 1.0 - x
    return ks[int(np.argmax(chord - yn))]


@dataclass
class Discovery:
    """Result of Phase 1: M, assignments z_i (per partition id), centroids mu_d and the selection curve."""

    num_domains: int
    assignments: list[int]
    centroids: np.ndarray
    criterion: str
    scores: dict[int, float] = field(default_factory=dict)  # inertia (elbow) or silhouette per k

    def to_json(self) -> dict:
        """JSON-able summary (for summary.json)."""
        return {"M": self.num_domains, "assignments": list(map(int, self.assignments)), "criterion": self.criterion,
                "scores": {str(k): float(v) for k, v in self.scores.items()}}


def discover_domains(updates: np.ndarray, *, num_domains: int = 0, select: str = "elbow", max_domains: int = 10,
                     seed: int = 0) -> Discovery:
    """Phase 1 (Sec. 4.2): l2-normalise the update vectors, run scikit-learn K-means (k-means++, 10
    restarts) and return assignments and centroids. ``num_domains`` > 0 fixes M; otherwise M is chosen
    in 1..min(max_domains, N) by the elbow of the inertia curve, or in 2..min(max_domains, N-1) by the
    best silhouette score (``select``)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    u = normalize_updates(updates)
    n = len(u)
    if n == 0:
        raise ValueError("no update vectors to cluster")

    def fit(k: int) -> KMeans:
        return KMeans(n_clusters=k, n_init=10, random_state=seed).fit(u)

    scores: dict[int, float] = {}
    if num_domains > 0:
        if num_domains > n:
            raise ValueError(f"M={num_domains} pseudo-domains but only {n} clients to cluster")
        k, criterion = num_domains, "fixed"
    elif select == "elbow":
        fits = {k: fit(k) for k in range(1, min(max_domains, n) + 1)}
        scores = {k: float(f.inertia_) for k, f in fits.items()}
        k, criterion = elbow_choice(scores), "elbow"
    elif select == "silhouette":
        top = min(max_domains, n - 1)
        if top < 2:
            k, criterion = 1, "silhouette"
        else:
            for kk in range(2, top + 1):
                labels = fit(kk).labels_
                scores[kk] = float(silhouette_score(u, labels)) if len(set(labels)) > 1 else -1.0
            k, criterion = max(scores, key=lambda kk: (scores[kk], -kk)), "silhouette"
    else:
        raise ValueError(f"unknown selection rule {select!r}")
    final = fit(k)
    labels = _canonical_labels(final.labels_)
    centroids = np.stack([u[labels == d].mean(axis=0) for d in range(k)])
    return Discovery(k, labels.tolist(), centroids, criterion, scores)


def _canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters in order of first appearance (deterministic pseudo-domain ids)."""
    order: dict[int, int] = {}
    for lab in labels:
        order.setdefault(int(lab), len(order))
    return np.array([order[int(lab)] for lab in labels], dtype=np.int64)


def adjusted_rand_index(true_domains, assignments) -> float:
    """Adjusted Rand Index of the pseudo-domains against the true domains (Sec. 5.8)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(list(true_domains), list(assignments)))


def marginal_class_log_probs(logits: torch.Tensor, num_classes: int) -> torch.Tensor:
    """log p(c | x) = logsumexp_d log softmax(logits)_{j(d, c)}: the class marginal of the joint softmax
    (used for the evaluation loss only; accuracy is class-only argmax)."""
    m = logits.shape[1] // num_classes
    log_p = torch.log_softmax(logits, dim=1).view(len(logits), m, num_classes)
    return torch.logsumexp(log_p, dim=1)
