"""Datasets: scikit-learn digits (embedded), torchvision datasets, and any Keras-layout ``.npz`` file.

Every loader returns a :class:`Dataset` with float32 images in NCHW layout, standardised per channel
with the training split's mean and std, and int64 labels in ``[0, num_classes)``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpers.core.errors import DataError
from fedpers.core.synthetic import SYNTHETIC

NAMED_DATASETS = ("digits", "mnist", "fmnist", "cifar10", "cifar100")
DOMAIN_DATASETS = ("mnist_usps", "digits_domains")
DIGITS_SIZE = 28  # common side of MNIST + USPS (USPS 16x16 is upsampled; ours)
_NPZ_NAMES = {  # file names looked for in data_dir, first match wins
    "mnist": ("mnist.npz",),
    "fmnist": ("fmnist.npz", "fashion_mnist.npz", "fashion-mnist.npz"),
    "cifar10": ("cifar10.npz", "cifar-10.npz"),
    "cifar100": ("cifar100.npz", "cifar-100.npz"),
}


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays of one dataset, ready for a model (NCHW float32, int64 labels)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    # Optional per-sample domain ids (feature-skew data, e.g. PACS): int64 arrays aligned with y_train /
    # y_test, and the domains' names; None / () for single-domain data.
    d_train: np.ndarray | None = None
    d_test: np.ndarray | None = None
    domain_names: tuple[str, ...] = ()

    @property
    def num_domains(self) -> int:
        """Number of domains (0 without domain ids)."""
        if self.d_train is None:
            return 0
        return max(len(self.domain_names), int(max(self.d_train.max(), self.d_test.max())) + 1)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one image."""
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def default_data_dir() -> Path:
    """Where torchvision downloads go when ``data_dir`` is empty."""
    return Path(os.environ.get("FEDPERS_DATA_DIR", Path.home() / ".cache" / "fedpers" / "data"))


def _to_nchw(x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim == 3:  # N, H, W (grayscale)
        return x[:, None, :, :]
    if x.ndim == 4 and x.shape[-1] in (1, 3):  # N, H, W, C (Keras layout)
        return np.transpose(x, (0, 3, 1, 2))
    if x.ndim == 4 and x.shape[1] in (1, 3):  # already N, C, H, W
        return x
    raise DataError(f"{what}: images must have shape (N,H,W) or (N,H,W,C) with C in 1 or 3, got {x.shape}")


# Float images whose values reach this are refused: their squares overflow float32 (3.4e38), the
# precision every model computes in, so such a value can only be a corrupt pixel (ours).
MAX_PIXEL = 1e19


def _standardise(x_train: np.ndarray, x_test: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel standardisation with the training split's mean and std. The statistics are taken in
    float64: in float32 the sum of squares of a large value overflows, the std becomes inf and every image
    0 (a run that trains on zeros)."""
    xtr = x_train.astype(np.float32) / scale
    xte = x_test.astype(np.float32) / scale
    # applied in float32 (as before: the same numbers for data whose float32 statistics were right), and
    # without a float64 copy of the images
    mean = xtr.mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    std = (xtr.std(axis=(0, 2, 3), keepdims=True, dtype=np.float64) + 1e-6).astype(np.float32)
    return np.ascontiguousarray((xtr - mean) / std), np.ascontiguousarray((xte - mean) / std)


def _check_pixels(name: str, split: str, x: np.ndarray) -> None:
    """Float images hold finite values below :data:`MAX_PIXEL` in magnitude (checked before any arithmetic,
    which would warn about each overflow first)."""
    if not np.issubdtype(x.dtype, np.floating):
        return
    if not np.isfinite(x).all():
        raise DataError(f"{name}: {split} contains NaN or Inf pixels")
    largest = float(np.abs(x).max()) if x.size else 0.0
    if largest >= MAX_PIXEL:
        raise DataError(f"{name}: {split} holds a pixel of magnitude {largest:.3g}; image values must stay below "
                        f"{MAX_PIXEL:.0e} (a corrupt pixel? rescale the images)")


def from_arrays(name: str, x_train, y_train, x_test, y_test, num_classes: int | None = None, *,
                d_train=None, d_test=None, domain_names=None) -> Dataset:
    """Validate raw arrays (any image layout) and return a standardised :class:`Dataset`; ``d_train`` /
    ``d_test`` (optional, both or neither) are per-sample integer domain ids."""
    for split, x in (("x_train", x_train), ("x_test", x_test)):
        if np.iscomplexobj(np.asarray(x)):  # numpy would drop the imaginary part with a warning
            raise DataError(f"{name}: {split} holds complex numbers; images are real-valued (take the magnitude "
                            "or the real part yourself)")
    x_train = _to_nchw(np.asarray(x_train), f"{name} x_train")
    x_test = _to_nchw(np.asarray(x_test), f"{name} x_test")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{name}: train images {x_train.shape[1:]} and test images {x_test.shape[1:]} differ")
    y_train = np.asarray(y_train).reshape(-1)
    y_test = np.asarray(y_test).reshape(-1)
    if len(y_train) != len(x_train) or len(y_test) != len(x_test):
        raise DataError(
            f"{name}: {len(x_train)} train images but {len(y_train)} labels, "
            f"{len(x_test)} test images but {len(y_test)} labels"
        )
    if len(y_train) == 0 or len(y_test) == 0:
        raise DataError(f"{name}: train and test splits must both be non-empty")
    _check_pixels(name, "x_train", x_train)
    _check_pixels(name, "x_test", x_test)
    for split, y in (("y_train", y_train), ("y_test", y_test)):
        if not np.issubdtype(y.dtype, np.integer):
            if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
                continue
            raise DataError(f"{name}: {split} must hold integer class labels, got dtype {y.dtype}")
    y_train = y_train.astype(np.int64)
    y_test = y_test.astype(np.int64)
    inferred = int(max(y_train.max(), y_test.max())) + 1
    if num_classes is None:
        distinct = np.union1d(y_train, y_test)
        if inferred > 2 * len(distinct):  # most of the inferred classes would have no sample at all
            raise DataError(
                f"{name}: labels run up to {inferred - 1} but only {len(distinct)} distinct values occur "
                f"(largest: {', '.join(str(int(v)) for v in distinct[-3:])}): a stray label? To train "
                f"{inferred} classes, name them with class_names in the data file")
    num_classes = inferred if num_classes is None else int(num_classes)
    for split, y in (("y_train", y_train), ("y_test", y_test)):
        if y.min() < 0 or y.max() >= num_classes:
            raise DataError(f"{name}: {split} has labels outside [0, {num_classes})")
    present = np.unique(y_train)
    if len(present) < 2:  # every prediction would be right: accuracy 1.0 that says nothing
        raise DataError(f"{name}: y_train holds a single class ({int(present[0])}); classification needs at "
                        "least two")
    scale = 255.0 if x_train.dtype == np.uint8 else 1.0
    xtr, xte = _standardise(x_train, x_test, scale)
    if not (np.isfinite(xtr).all() and np.isfinite(xte).all()):
        raise DataError(f"{name}: images contain NaN or Inf")
    domains = _check_domains(name, d_train, d_test, len(y_train), len(y_test), domain_names)
    return Dataset(name, xtr, y_train, xte, y_test, num_classes, *domains)


def _check_domains(name: str, d_train, d_test, n_train: int, n_test: int, domain_names):
    """(d_train, d_test, domain_names) validated: both or neither, integer ids >= 0, one per sample."""
    if d_train is None and d_test is None:
        return None, None, ()
    if d_train is None or d_test is None:
        raise DataError(f"{name}: d_train and d_test must be given together")
    out = []
    for split, d, n in (("d_train", d_train, n_train), ("d_test", d_test, n_test)):
        d = np.asarray(d).reshape(-1)
        if len(d) != n:
            raise DataError(f"{name}: {split} has {len(d)} domain ids for {n} images")
        if not np.issubdtype(d.dtype, np.integer) or d.min() < 0:
            raise DataError(f"{name}: {split} must hold non-negative integer domain ids")
        out.append(d.astype(np.int64))
    names = tuple(str(x) for x in (domain_names if domain_names is not None else ()))
    return out[0], out[1], names


def load_npz(path: str | Path) -> Dataset:
    """Load a Keras-layout ``.npz`` (x_train, y_train, x_test, y_test, optional class_names)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as f:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in f.files]
            if missing:
                raise DataError(f"{p}: missing arrays {', '.join(missing)} (expected Keras layout)")
            arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
            num_classes = len(f["class_names"]) if "class_names" in f.files else None
            if "d_train" in f.files and "d_test" in f.files:  # multi-domain data (e.g. PACS)
                arrays.update(d_train=f["d_train"], d_test=f["d_test"],
                              domain_names=f["domain_names"] if "domain_names" in f.files else None)
    except DataError:
        raise
    except Exception as exc:  # zip/pickle/format errors of a corrupt file
        raise DataError(f"{p}: not a readable .npz file ({type(exc).__name__})") from None
    return from_arrays(p.stem, num_classes=num_classes, **arrays)


DIGITS_CACHE = "digits-80-20-rs0.npz"  # the split below, saved once per machine


def load_digits_dataset() -> Dataset:
    """scikit-learn's 8x8 digits, split 80/20 (stratified, fixed random_state=0)."""
    x_tr, y_tr, x_te, y_te = digits_split()
    return from_arrays("digits", x_tr, y_tr, x_te, y_te, num_classes=10)


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of scikit-learn's digits as uint8 8x8 images, split 80/20
    (stratified, fixed random_state=0).

    The split is saved once as ``default_data_dir()/digits-80-20-rs0.npz`` and read from there: a deployed
    SuperNode starts a process for every message, and importing scikit-learn to rebuild the same arrays
    cost about 1 s of each. The file holds exactly the arrays scikit-learn gives; an unreadable or
    unwritable cache falls back to scikit-learn."""
    cache = default_data_dir() / DIGITS_CACHE
    try:
        with np.load(cache, allow_pickle=False) as f:
            return f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    except (OSError, KeyError, ValueError):
        pass
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0 * 255.0).astype(np.uint8)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0
    )
    save_npz_quietly(cache, 0o644, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    return x_tr, y_tr, x_te, y_te


def save_npz_quietly(path: Path, mode: int, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` (file mode ``mode``) atomically, a temp file renamed, or not at all if
    that fails: a cache must never leave a half-written file for another process to read."""
    from fedpers.core.state_store import atomic_save_npz

    try:
        atomic_save_npz(path, arrays, mode=mode)
    except OSError:
        pass  # no cache this time: the next reader builds the data again


def _load_torchvision(name: str, root: Path) -> Dataset:
    import torchvision.datasets as tvd

    cls = {"mnist": tvd.MNIST, "fmnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10,
           "cifar100": tvd.CIFAR100}[name]
    try:
        train = cls(str(root), train=True, download=True)
        test = cls(str(root), train=False, download=True)
    except Exception as exc:
        raise DataError(
            f"could not load {name} with torchvision into {root} ({type(exc).__name__}: {exc}); "
            f"offline, set data_dir to a folder holding {_NPZ_NAMES[name][0]}"
        ) from None

    def arrays(ds):
        x = ds.data.numpy() if hasattr(ds.data, "numpy") else np.asarray(ds.data)
        return x, np.asarray(ds.targets)

    (xtr, ytr), (xte, yte) = arrays(train), arrays(test)
    return from_arrays(name, xtr, ytr, xte, yte, num_classes=len(train.classes))


def find_dataset(dataset: str, data_dir: str = "") -> str:
    """Where :func:`load_dataset` would read ``dataset`` from, without reading it (a sweep checks every
    dataset before its first run): a file path, or ``torchvision`` for a named set to download. A name
    that is no dataset, or a file or ``data_dir`` that is not there, is a DataError."""
    if dataset.endswith(".npz") or os.sep in dataset:
        if not Path(dataset).is_file():
            raise DataError(f"data file not found: {dataset}")
        return dataset
    if dataset in ("digits", "digits_domains"):
        return "scikit-learn"
    if dataset == SYNTHETIC:  # generated per client (fedpers/core/federation.py: SyntheticFederation)
        return "generated"
    if dataset == "mnist_usps":
        root = Path(data_dir) if data_dir else default_data_dir()
        for fname in ("mnist.npz", "usps.npz"):
            if not (root / fname).is_file():
                raise DataError(f"data file not found: {root / fname} (mnist_usps needs mnist.npz and usps.npz "
                                "in data_dir)")
        return str(root)
    if dataset not in _NPZ_NAMES:
        raise DataError(
            f"unknown dataset '{dataset}': use one of {', '.join((*NAMED_DATASETS, SYNTHETIC))} or a path to a "
            ".npz file"
        )
    root = Path(data_dir) if data_dir else default_data_dir()
    if data_dir and not root.is_dir():
        raise DataError(f"data_dir not found: {root}")
    for fname in _NPZ_NAMES[dataset]:
        if (root / fname).is_file():
            return str(root / fname)
    return "torchvision"


@functools.lru_cache(maxsize=4)
def load_dataset(dataset: str, data_dir: str = "") -> Dataset:
    """Load ``dataset`` by name or ``.npz`` path; named sets are read from ``data_dir`` when there.

    Cached per process, so every Ray actor reads its data once per run, not once per round.
    """
    if dataset.endswith(".npz") or os.sep in dataset:
        return load_npz(dataset)
    if dataset == "digits":
        return load_digits_dataset()
    if dataset in DOMAIN_DATASETS:  # multi-domain sets built from several sources
        return load_domain_dataset(dataset, data_dir)
    where = find_dataset(dataset, data_dir)  # one rule for where a named set is read from
    if where == "torchvision":
        return _load_torchvision(dataset, Path(data_dir) if data_dir else default_data_dir())
    return load_npz(where)


# --- multi-domain datasets (feature skew; split by fedpers/core/domains.py) ---------------------------------
def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of uint8 (N, H, W) images to (N, size, size), uint8."""
    import torch
    import torch.nn.functional as F

    if x.shape[1] == size and x.shape[2] == size:
        return x
    t = torch.as_tensor(x, dtype=torch.float32)[:, None]
    out = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return out[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(f"data file not found: {path} (mnist_usps needs mnist.npz and usps.npz in data_dir)")
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}


def load_mnist_usps(data_dir: str | Path, size: int = DIGITS_SIZE):
    """MNIST + USPS as one two-domain dataset (domain 0 = MNIST, 1 = USPS), images resized to size x size."""
    root = Path(data_dir) if data_dir else default_data_dir()
    parts = [_read_npz(root / "mnist.npz"), _read_npz(root / "usps.npz")]
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in ("x_train", "y_train", "x_test", "y_test", "d_train", "d_test")}
    for d, part in enumerate(parts):
        for split in ("train", "test"):
            arrays[f"x_{split}"].append(resize_images(part[f"x_{split}"], size))
            arrays[f"y_{split}"].append(part[f"y_{split}"].astype(np.int64))
            arrays[f"d_{split}"].append(np.full(len(part[f"y_{split}"]), d, np.int64))
    cat = {k: np.concatenate(v) for k, v in arrays.items()}
    return from_arrays("mnist_usps", cat["x_train"], cat["y_train"], cat["x_test"], cat["y_test"], num_classes=10,
                       d_train=cat["d_train"], d_test=cat["d_test"], domain_names=("mnist", "usps"))


def load_digits_domains(seed: int = 0):
    """scikit-learn digits as a tiny two-domain set: each image once, original (domain 0) or inverted
    (domain 1), half and half by a seeded shuffle (train/test split as :func:`load_digits_dataset`)."""
    x_tr, y_tr, x_te, y_te = digits_split()
    rng = np.random.default_rng(seed)
    out = []
    for xs in (x_tr, x_te):
        d = (rng.permutation(len(xs)) % 2).astype(np.int64)
        xs = np.where(d[:, None, None] == 1, 255 - xs, xs).astype(np.uint8)
        out.append((xs, d))
    (x_tr, d_tr), (x_te, d_te) = out
    return from_arrays("digits_domains", x_tr, y_tr, x_te, y_te, num_classes=10, d_train=d_tr, d_test=d_te,
                       domain_names=("original", "inverted"))


def load_domain_dataset(name: str, data_dir: str = ""):
    """Load one of :data:`DOMAIN_DATASETS` by name."""
    if name == "mnist_usps":
        return load_mnist_usps(data_dir)
    if name == "digits_domains":
        return load_digits_domains()
    raise DataError(f"unknown multi-domain dataset '{name}'")
