"""An image-folder tree to the project's ``.npz`` layout (the Keras ``mnist.npz`` layout plus
``class_names`` and, for domain data, ``d_train`` / ``d_test`` / ``domain_names``).

Tree layouts (one folder per split, every split holding the same classes)::

    ROOT/train/<class>/<image>             ROOT/test/<class>/<image>
    ROOT/train/<domain>/<class>/<image>    ROOT/test/<domain>/<class>/<image>     (domains=True)

Class ids are the class folder names in sorted order (for CIFAR-100 that is the official fine-label order,
which is alphabetical); domain ids likewise, unless ``domain_order`` names the domains in the order their
ids take (for a dataset whose published file orders its domains otherwise, e.g. PACS' photo, art_painting,
cartoon, sketch: ``partition: domain`` gives client k domain ``k mod D``, so the ids decide which domains
get more clients). Images are read in (domain id, class, sorted file name) order, so the same tree gives
the same file byte for byte. Every image is decoded with Pillow (the library torchvision reads images
with) and converted to RGB or grayscale; with ``size`` each is resized to ``size x size`` with Pillow's
``Image.resize``, which antialiases when it shrinks (filter ``resample``: bilinear by default, bicubic or
lanczos; Pillow's own default for RGB images is bicubic, the filter shared/data/pacs.npz was made with);
without it every image must already have one size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpers.core.errors import DataError

SPLITS = ("train", "test")
RESAMPLE = ("bilinear", "bicubic", "lanczos")  # Pillow's filters by name; the first is the default
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


@dataclass(frozen=True)
class ImportedSplit:
    """One split of an imported tree: images (N, H, W, C) uint8, labels, domain ids (or None), file paths."""

    images: np.ndarray
    labels: np.ndarray
    domains: np.ndarray | None
    files: tuple[str, ...]


def _subfolders(folder: Path, what: str) -> list[str]:
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise DataError(f"{folder}: no {what} folders in it (expected {folder}/<{what}>/...)")
    return names


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_image(path: Path, size: int | None, gray: bool, resample: str = RESAMPLE[0]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = img.convert("L" if gray else "RGB")
            if size is not None and img.size != (size, size):
                img = img.resize((size, size), Image.Resampling[resample.upper()], reducing_gap=None)
            arr = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from None
    return arr[:, :, None] if gray else arr


def _ordered_domains(found: list[str], domain_order, where: Path) -> list[str]:
    """``found`` (sorted folder names) in ``domain_order``, which must name each of them once."""
    if domain_order is None:
        return found
    order = [str(d) for d in domain_order]
    duplicated = sorted({d for d in order if order.count(d) > 1})
    if duplicated:
        raise DataError(f"domain order names {', '.join(duplicated)} more than once")
    unknown, missing = sorted(set(order) - set(found)), sorted(set(found) - set(order))
    if unknown or missing:
        raise DataError(f"{where}: domain order {','.join(order)} does not name its domain folders "
                        f"{','.join(found)} each once (" + "; ".join(
                            ([f"no folder: {', '.join(unknown)}"] if unknown else [])
                            + ([f"not named: {', '.join(missing)}"] if missing else [])) + ")")
    return order


def tree_layout(root: Path, domains: bool, domain_order=None) -> tuple[list[str], list[str]]:
    """(class names, domain names) of the tree at ``root``: the sorted folder names, checked to be the same
    in every split (and, with domains, in every domain); the domains in ``domain_order`` when it is given
    (it must name every domain folder once)."""
    root = Path(root)
    if domain_order is not None and not domains:
        raise DataError("a domain order needs a tree with a domain level (domains=True, --domains)")
    if not root.is_dir():
        raise DataError(f"{root}: not a folder")
    classes: list[str] | None = None
    domain_names: list[str] | None = None
    for split in SPLITS:
        split_dir = root / split
        if not split_dir.is_dir():
            raise DataError(f"{root}: has no '{split}' folder (expected {root}/{'/'.join(SPLITS)})")
        groups = [split_dir]
        if domains:
            names = _ordered_domains(_subfolders(split_dir, "domain"), domain_order, split_dir)
            if domain_names is not None and names != domain_names:
                raise DataError(f"{split_dir}: domains {names} differ from {SPLITS[0]}'s {domain_names}")
            domain_names = names
            groups = [split_dir / d for d in names]
        for group in groups:
            names = _subfolders(group, "class")
            if classes is not None and names != classes:
                extra = sorted(set(names) ^ set(classes))
                raise DataError(f"{group}: its classes differ from {root / SPLITS[0]}'s (not in both: "
                                f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''})")
            classes = names
    return classes or [], domain_names or []


def read_split(root: Path, split: str, classes: list[str], domain_names: list[str], size: int | None,
               gray: bool, resample: str = RESAMPLE[0]) -> ImportedSplit:
    """Every image of ``root/split`` in sorted (domain, class, file) order, with its labels."""
    groups = [(None, Path(root) / split)] if not domain_names else [
        (d, Path(root) / split / name) for d, name in enumerate(domain_names)]
    images: list[np.ndarray] = []
    labels: list[int] = []
    doms: list[int] = []
    files: list[str] = []
    shape = None
    for domain, group in groups:
        for label, cls in enumerate(classes):
            for path in _images_in(group / cls):
                arr = _read_image(path, size, gray, resample)
                if shape is None:
                    shape = arr.shape
                elif arr.shape != shape:
                    raise DataError(f"{path}: {arr.shape[1]}x{arr.shape[0]} where the first image is "
                                    f"{shape[1]}x{shape[0]}: pass a size to resize every image to one size")
                images.append(arr)
                labels.append(label)
                doms.append(0 if domain is None else domain)
                files.append(str(path.relative_to(root)))
    if not images:
        raise DataError(f"{Path(root) / split}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return ImportedSplit(np.stack(images), np.asarray(labels, dtype=np.int64),
                         np.asarray(doms, dtype=np.int64) if domain_names else None, tuple(files))


def import_image_folder(root: Path, *, size: int | None = None, domains: bool = False,
                        gray: bool = False, domain_order=None, resample: str = RESAMPLE[0]) -> dict[str, np.ndarray]:
    """The arrays of the project's ``.npz`` layout read from the image-folder tree at ``root`` (module
    docstring): ``x_train``, ``y_train``, ``x_test``, ``y_test`` (uint8 N x H x W x C, int64),
    ``class_names``, and with ``domains`` ``d_train``, ``d_test``, ``domain_names`` (domain ids in
    ``domain_order`` when given, else sorted by name); ``resample`` names the resize filter (``RESAMPLE``)."""
    if size is not None and size < 1:
        raise DataError(f"size must be a positive number of pixels, got {size}")
    if resample not in RESAMPLE:
        raise DataError(f"resample must be one of {', '.join(RESAMPLE)}, got {resample!r}")
    classes, domain_names = tree_layout(Path(root), domains, domain_order)
    train = read_split(root, "train", classes, domain_names, size, gray, resample)
    test = read_split(root, "test", classes, domain_names, size, gray, resample)
    if train.images.shape[1:] != test.images.shape[1:]:
        raise DataError(f"{root}: train images are {train.images.shape[1:]} and test images "
                        f"{test.images.shape[1:]}: pass a size to resize both")
    out = {"x_train": train.images, "y_train": train.labels, "x_test": test.images, "y_test": test.labels,
           "class_names": np.asarray(classes)}
    if domains:
        out.update(d_train=train.domains, d_test=test.domains, domain_names=np.asarray(domain_names))
    return out


def channel_statistics(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population std of uint8 images (N, H, W, C) scaled to [0, 1], in float64: the
    figures CIFAR's published statistics are (``x / 255`` over every training pixel)."""
    x = x_train.astype(np.float64) / 255.0
    return x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))
