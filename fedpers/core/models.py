"""Models and the one place that splits a model into parts.

Every fedpers model has the child modules ``backbone`` (input -> feature vector) and ``head`` (feature
vector -> class logits); FedEAGD's model also has ``residual`` (the personalized residual branch on the
features). :func:`parameter_names` is the only code that knows which state entries belong to which part;
everything else asks it (or :func:`get_arrays` / :func:`set_arrays`). Parts: ``backbone``, ``head``,
``residual``, ``personal`` (everything but the backbone: head plus residual, = ``head`` for models
without a residual) and ``all``.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch
from torch import nn

from fedpers.core.errors import ClientUpdateError, DataError
from fedpers.core.synthetic import SYNTHETIC

Part = Literal["backbone", "head", "residual", "personal", "all"]
ModelKind = Literal["cnn", "se_cnn", "gn_cnn", "mlp", "residual_mlp"]
HEAD_MODULE = "head"
RESIDUAL_MODULE = "residual"


def simple_cnn_padding(image_size: tuple[int, int], kernel: int = 5) -> int:
    """Convolution padding of :class:`SimpleCNN` for ``image_size``: 0 (PFLlib's ``FedAvgCNN``) whenever two
    unpadded 5x5 conv + 2x2 pool blocks leave at least a 1x1 map (inputs of 16x16 and larger: MNIST,
    USPS, CIFAR), else ``kernel // 2`` = 2 ("same" convolutions, for scikit-learn's 8x8 digits)."""
    smallest = min(image_size)
    after_two_blocks = ((smallest - (kernel - 1)) // 2 - (kernel - 1)) // 2
    return 0 if after_two_blocks >= 1 else kernel // 2


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with a faster CPU path for channels-first inputs where no gradient is taken (an
    evaluation or FedEAGD's EMA teacher on a batch that is not channels-last already): PyTorch's channels-last
    max-pool kernel is vectorised over channels, its channels-first one is not (a 64x32x32x32 batch: 10.8 ms
    against 5.9 ms with the two layout copies, one thread). A maximum is exact in any layout, so the output
    is bit for bit that of ``nn.MaxPool2d`` (tested, ties included), in the input's layout; with a gradient
    the layout copies cost more than they save, so training takes PyTorch's own path. The federation's
    CPU batches are channels-last already (:func:`fedpers.core.federation.device_layout`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        takes_gradient = torch.is_grad_enabled() and x.requires_grad
        if (x.device.type != "cpu" or x.dim() != 4 or self.return_indices or takes_gradient
                or x.is_contiguous(memory_format=torch.channels_last)):
            return super().forward(x)
        return super().forward(x.contiguous(memory_format=torch.channels_last)).contiguous()


class SimpleCNN(nn.Module):
    """The pFedKDH paper's CNN: two conv + ReLU + max-pool blocks, dropout, flatten, FC projection
    (= backbone) and a linear head.

    On inputs of 16x16 and larger this is exactly PFLlib's ``FedAvgCNN``, the "simple CNN" of the pFL
    baselines the paper compares with (the paper gives no sizes): 5x5 convolutions without padding with
    32 and 64 channels, 2x2 max-pools, flatten (1,024 on MNIST, 1,600 on 3x32x32), a ``feature_dim`` = 512
    projection and a linear head; 582,026 parameters on MNIST and 878,538 on CIFAR-10. The paper's dropout
    after the conv blocks is kept (rate ours). Inputs too small for unpadded convolutions (8x8 digits)
    use padding 2 (:func:`simple_cnn_padding`).
    """

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25):
        super().__init__()
        pad = simple_cnn_padding(image_size)
        h, w = image_size
        if pad == 0:
            h, w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        else:
            h, w = h // 4, w // 4
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=pad), nn.ReLU(), MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=pad), nn.ReLU(), MaxPool2d(2),
            nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(64 * h * w, feature_dim), nn.ReLU(),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.backbone(x))


SE_GATE_BIAS = 3.0  # sigmoid(3) = 0.95: an untrained excitation gate is nearly open (ours)


class SqueezeExcitation(nn.Module):
    """Squeeze-and-excitation (Hu et al., CVPR 2018): channel weights ``sigmoid(W2 relu(W1 avgpool(x)))``
    rescale the feature map. ``reduction`` 8 is ours (the FedEAGD summary gives no width).

    The excitation's last bias starts at :data:`SE_GATE_BIAS`, so an untrained block passes its features
    almost unchanged (gate 0.95) instead of halving them (gate sigmoid(0) = 0.5 under PyTorch's default
    init). Without normalization layers, two half-open gates quarter the features and the extractor learned
    several times slower than the plain CNN (digits, centralized, 6 epochs at lr 0.05: test accuracy 0.64
    with gates at 0.5, 0.95 with gates at 0.95, 0.97 without SE). Ours; the summary is silent."""

    def __init__(self, channels: int, reduction: int = 8):
        super().__init__()
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, channels)
        nn.init.constant_(self.fc2.bias, SE_GATE_BIAS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        s = x.mean(dim=(2, 3))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * s[:, :, None, None]


class GatedResidual:
    """FedEAGD's personalized part on a backbone's features, shared by :class:`SECNN` and
    :class:`ResidualMLP`: a gated residual branch ``residual`` and the linear classifier ``head``,
    ``logits = head(z + fusion * residual(z))``.

    The residual is a bottleneck MLP ``feature_dim -> feature_dim/4 -> feature_dim`` whose last layer starts
    at zero, so switching the gate on does not perturb the features (ours; :meth:`reset_residual_output`
    gives it the default init). ``fusion`` is a plain attribute set each round by the client (the schedule
    of :func:`fedpers.algorithms.fedeagd.fusion_coefficient`), not model state."""

    def add_residual_and_head(self, feature_dim: int, num_classes: int) -> None:
        """Build ``residual`` then ``head`` (in this order: the order of their seeded init)."""
        bottleneck = max(1, feature_dim // 4)
        self.residual = nn.Sequential(nn.Linear(feature_dim, bottleneck), nn.ReLU(),
                                      nn.Linear(bottleneck, feature_dim))
        nn.init.zeros_(self.residual[2].weight)
        nn.init.zeros_(self.residual[2].bias)
        self.head = nn.Linear(feature_dim, num_classes)
        self.fusion = 0.0

    def reset_residual_output(self, seed: int) -> None:
        """Give the residual's output layer PyTorch's default Linear init instead of zeros, drawn from
        ``seed`` so that every client starts from the same residual (``fedeagd_residual_init: default``)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.residual[2].reset_parameters()

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Logits from shared features ``z``: the gated residual fusion, then the head."""
        if self.fusion != 0.0:
            z = z + self.fusion * self.residual(z)
        return self.head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.classify(self.backbone(x))


class SECNN(GatedResidual, nn.Module):
    """FedEAGD's model: a shared feature extractor of two conv blocks with squeeze-and-excitation
    (``backbone``), a personalized gated residual branch on its features (``residual``) and a linear
    classifier (``head``): ``logits = head(z + fusion * residual(z))``, ``z = backbone(x)``
    (:class:`GatedResidual`).

    Widths are ours (the summary gives only the extractor's size, 2,153,216 parameters on CIFAR-100):
    the foundation's CNN (conv 5x5 with 32 and 64 channels, padding 2, max-pool, dropout, FC
    ``feature_dim``) with an SE module (reduction 8) after each conv block, which gives 2,152,748
    parameters for 3x32x32 inputs and ``feature_dim`` 512 (-468, -0.02%). The residual is a bottleneck
    MLP ``feature_dim -> feature_dim/4 -> feature_dim`` whose last layer starts at zero.
    """

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25, se_reduction: int = 8):
        super().__init__()
        h, w = image_size
        flat = 64 * (h // 4) * (w // 4)
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=2), nn.ReLU(),
            SqueezeExcitation(32, se_reduction), MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2), nn.ReLU(),
            SqueezeExcitation(64, se_reduction), MaxPool2d(2),
            nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(flat, feature_dim), nn.ReLU(),
        )
        self.add_residual_and_head(feature_dim, num_classes)


class GroupNormCNN(nn.Module):
    """The JDFL paper's CNN (Sec. 5.2): three conv blocks with GroupNorm, two hidden fully connected
    layers (= backbone) and a linear head (expanded to M x C logits by JDFL).

    Sizes are ours (the paper's Appendix B table did not survive extraction): block ``b`` is a 3x3 conv
    (padding 1; 32, 64, 128 channels), GroupNorm (8 groups), ReLU, 2x2 max-pool; then dropout, flatten,
    FC ``2*feature_dim``, ReLU, FC ``feature_dim``, ReLU. The flatten size follows the input
    (``128 * (H//8) * (W//8)``), so 64x64 PACS, 28x28 digits and 8x8 scikit-learn digits all work.
    """

    widths = (32, 64, 128)

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25, groups: int = 8):
        super().__init__()
        h, w = image_size
        blocks, c = [], in_channels
        for width in self.widths:
            blocks.append(nn.Sequential(nn.Conv2d(c, width, kernel_size=3, padding=1),
                                        nn.GroupNorm(min(groups, width), width), nn.ReLU(), MaxPool2d(2)))
            c = width
            h, w = max(h // 2, 1), max(w // 2, 1)
        self.backbone = nn.Sequential(
            *blocks, nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(c * h * w, 2 * feature_dim), nn.ReLU(),
            nn.Linear(2 * feature_dim, feature_dim), nn.ReLU(),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.backbone(x))


def vector_backbone(in_features: int, feature_dim: int) -> nn.Sequential:
    """The backbone of :class:`MLP` and :class:`ResidualMLP`: flatten, ``Linear(in_features, feature_dim)``,
    ReLU (one hidden layer, ours)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, feature_dim), nn.ReLU())


class MLP(nn.Module):
    """A model for vector data (``dataset: synthetic``, 1 x 1 x 60 "images"): backbone = flatten + one
    hidden layer (``Linear(C*H*W, feature_dim)`` + ReLU), head = ``Linear(feature_dim, num_classes)``.

    FedProx trained multinomial logistic regression on Synthetic(alpha, beta) (Li et al., MLSys 2020, Sec.
    5.1); every fedpers method splits its model into a shared backbone and a head, so the smallest model
    with both, one hidden layer (ours). No dropout: ``dropout`` is accepted and not used."""

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25):
        super().__init__()
        self.backbone = vector_backbone(in_channels * image_size[0] * image_size[1], feature_dim)
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.backbone(x))


class ResidualMLP(GatedResidual, nn.Module):
    """FedEAGD's model on vector data: :class:`MLP`'s backbone with FedEAGD's gated residual branch and
    head (:class:`GatedResidual`); the SE modules of :class:`SECNN` act on convolution channels, which an
    MLP has none of (ours)."""

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25):
        super().__init__()
        self.backbone = vector_backbone(in_channels * image_size[0] * image_size[1], feature_dim)
        self.add_residual_and_head(feature_dim, num_classes)


# The kinds without convolutional blocks (JDFL's jdfl_layers other than head and all take some), and the
# kinds with FedEAGD's gated residual branch (a method whose own model has one trains it).
CONV_FREE_KINDS = ("mlp", "residual_mlp")
RESIDUAL_KINDS = ("se_cnn", "residual_mlp")
VECTOR_KIND_OF = {"se_cnn": "residual_mlp"}  # a method's own model -> its vector-data model; others: mlp


def model_kind_for(configured: str, method_kind: str, dataset: str) -> str:
    """The model a run trains: ``model_kind`` when set, else the method's own (``method_kind``), except on
    ``dataset: synthetic``, whose 60-feature vectors no convolution fits: there :class:`MLP`, or
    :class:`ResidualMLP` for a method whose own model has FedEAGD's residual branch (ours, see :class:`MLP`)."""
    if configured:
        return configured
    if dataset == SYNTHETIC:
        return VECTOR_KIND_OF.get(method_kind, "mlp")
    return method_kind


def build_model(input_shape: Sequence[int], num_classes: int, *, feature_dim: int = 512,
                dropout: float = 0.25, seed: int | None = None, kind: ModelKind = "cnn") -> nn.Module:
    """Build the model ``kind`` (``cnn``: :class:`SimpleCNN`; ``se_cnn``: FedEAGD's :class:`SECNN`;
    ``gn_cnn``: :class:`GroupNormCNN`; ``mlp``: :class:`MLP`; ``residual_mlp``: :class:`ResidualMLP`) for
    images of ``input_shape`` = (C, H, W); with ``seed`` the init is reproducible, so server and every
    client start from identical weights."""
    c, h, w = input_shape
    classes = {"cnn": SimpleCNN, "se_cnn": SECNN, "gn_cnn": GroupNormCNN, "mlp": MLP,
               "residual_mlp": ResidualMLP}
    if kind not in classes:
        raise ValueError(f"unknown model kind {kind!r}; known: {', '.join(classes)}")
    # the 2x2 max-pools (three, or two) each halve the image; an MLP takes any size
    smallest = {"gn_cnn": 8, "mlp": 1, "residual_mlp": 1}.get(kind, 4)
    if h < smallest or w < smallest:
        raise DataError(f"images of {h}x{w} pixels are too small for model {kind}: it needs at least "
                        f"{smallest}x{smallest}")
    cls = classes[kind]
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(c, (h, w), num_classes, feature_dim, dropout)
    return cls(c, (h, w), num_classes, feature_dim, dropout)


def parameter_names(model: nn.Module, part: Part) -> list[str]:
    """State-dict keys of ``part`` in a stable order, split by top-level module name: ``backbone``,
    ``head`` and ``residual`` are those modules, ``personal`` is both, ``backbone`` is everything else."""
    keys = list(model.state_dict().keys())
    if part == "all":
        return keys
    top = [k.split(".", 1)[0] for k in keys]
    personal = (HEAD_MODULE, RESIDUAL_MODULE)
    if part == "personal":
        return [k for k, t in zip(keys, top) if t in personal]
    if part == "backbone":  # everything outside the personal modules
        return [k for k, t in zip(keys, top) if t not in personal]
    if part in (HEAD_MODULE, RESIDUAL_MODULE):
        return [k for k, t in zip(keys, top) if t == part]
    raise ValueError(f"unknown model part {part!r}")


LAYER_SUBSETS = ("head", "last_conv_head", "last_two_conv_head", "all")
CONV_SUBSET_BLOCKS = {"last_conv_head": 1, "last_two_conv_head": 2}  # the last blocks each subset takes


def conv_block_names(model: nn.Module) -> list[list[str]]:
    """State-dict keys of each convolutional block of the backbone, in order. A block is a direct child
    of ``backbone`` that is or contains a ``Conv2d`` (GroupNormCNN: conv + GroupNorm; SimpleCNN: the conv)."""
    backbone = getattr(model, "backbone")
    keys = list(model.state_dict().keys())
    blocks = []
    for name, child in backbone.named_children():
        if isinstance(child, nn.Conv2d) or any(isinstance(m, nn.Conv2d) for m in child.modules()):
            prefix = f"backbone.{name}."
            blocks.append([k for k in keys if k.startswith(prefix)])
    return blocks


def layer_subset_names(model: nn.Module, subset: str) -> list[str]:
    """State-dict keys of a layer subset (JDFL Sec. 5.8): ``head`` (A), ``last_conv_head`` = last conv
    block + head (B, the paper's default), ``last_two_conv_head`` (C), or ``all``."""
    if subset == "all":
        return parameter_names(model, "all")
    head = parameter_names(model, "head")
    blocks = conv_block_names(model)
    if subset == "head":
        return head
    if subset not in CONV_SUBSET_BLOCKS:
        raise ValueError(f"unknown layer subset {subset!r}; known: {', '.join(LAYER_SUBSETS)}")
    if len(blocks) < CONV_SUBSET_BLOCKS[subset]:  # else the subset would quietly be a smaller one
        n = CONV_SUBSET_BLOCKS[subset]
        raise ValueError(f"layer subset {subset} takes the model's last {n} convolutional block{'s' * (n > 1)}; "
                         f"it has {len(blocks)}")
    return [*(k for b in blocks[-CONV_SUBSET_BLOCKS[subset]:] for k in b), *head]


def expand_head(model: nn.Module, num_outputs: int, seed: int | None = None) -> None:
    """Replace the linear head by a fresh ``Linear(in_features, num_outputs)`` (JDFL Phase 2: C -> M x C
    joint logits), seeded so that server and clients build the same initial head."""
    old = getattr(model, HEAD_MODULE)
    device = old.weight.device
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            new = nn.Linear(old.in_features, num_outputs)
    else:
        new = nn.Linear(old.in_features, num_outputs)
    setattr(model, HEAD_MODULE, new.to(device))


def parameter_count(model: nn.Module, part: Part) -> int:
    """Number of scalar entries of ``part`` (what travels when the part is sent)."""
    state = model.state_dict()
    return sum(state[k].numel() for k in parameter_names(model, part))


def get_arrays(model: nn.Module, part: Part) -> list[np.ndarray]:
    """Copies of ``part``'s tensors as numpy arrays (what a client uploads / the server broadcasts)."""
    state = model.state_dict()
    return [state[k].detach().cpu().numpy().copy() for k in parameter_names(model, part)]


def set_arrays(model: nn.Module, arrays: Sequence[np.ndarray], part: Part, *, source: str = "update") -> None:
    """Load ``arrays`` into ``part`` of ``model``, after checking count, shapes and finiteness."""
    names = parameter_names(model, part)
    if len(arrays) != len(names):
        raise ClientUpdateError(f"{source}: expected {len(names)} {part} arrays, got {len(arrays)}")
    state = model.state_dict()
    new = {}
    for name, arr in zip(names, arrays):
        arr = np.asarray(arr)
        if tuple(arr.shape) != tuple(state[name].shape):
            raise ClientUpdateError(
                f"{source}: array '{name}' has shape {tuple(arr.shape)}, model expects {tuple(state[name].shape)}"
            )
        if not np.issubdtype(arr.dtype, np.number) or not np.isfinite(arr).all():
            raise ClientUpdateError(f"{source}: array '{name}' is not finite numeric data")
        new[name] = torch.as_tensor(arr, dtype=state[name].dtype)
    model.load_state_dict(new, strict=False)


def array_shapes(model: nn.Module, part: Part) -> list[tuple[int, ...]]:
    """Shapes of ``part``'s arrays, in the order of :func:`parameter_names`."""
    state = model.state_dict()
    return [tuple(state[k].shape) for k in parameter_names(model, part)]


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters of the head (for head-only optimisation)."""
    return list(getattr(model, HEAD_MODULE).parameters())


def backbone_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters of the backbone, in :func:`parameter_names` order."""
    names = set(parameter_names(model, "backbone"))
    return [p for n, p in model.named_parameters() if n in names]
