"""Build ``cifar100.npz`` (the project's dataset layout) from a public repository that holds CIFAR-100 as
lossless PNG files, and check it against the published facts before it is used.

Source: the GitHub repository cyizhuo/CIFAR-100-dataset (``train|test/<fine class>/<file>.png``, 500 / 100
images per class). Give it as a checked-out folder, or as the bare git directory that a mirror of it is
(the images are read from its HEAD with ``git archive``; nothing of the repository is run). The images
go through ``fedpers data import-folder`` (class ids = the sorted folder names = CIFAR-100's official
fine-label order, which is alphabetical); the file is then checked:

* 100 classes, 500 training and 100 test images of 32x32 RGB per class (50,000 / 10,000);
* the per-channel mean and std of the training pixels (``x / 255``) equal the published
  0.50707516 0.48654887 0.44091784 / 0.26733429 0.25643846 0.27615047 to within 5e-7 (they are
  published to 8 decimals; a lossy or mis-decoded copy misses by far more).

A file that fails a check is removed and the script exits 1. The repository's images are sorted by class,
not in the official order; partitions are drawn by label, so the order changes no run's data.

    python benchmarks/build_cifar100.py --source /work/.mirror/cyizhuo+CIFAR-100-dataset/repo --out data/cifar100.npz
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


from fedpers.core.image_folder import channel_statistics
from repo_images import folders_root  # benchmarks/repo_images.py, beside this script

PUBLISHED_MEAN = (0.50707516, 0.48654887, 0.44091784)
PUBLISHED_STD = (0.26733429, 0.25643846, 0.27615047)
STAT_TOLERANCE = 5e-7
CLASSES, TRAIN_PER_CLASS, TEST_PER_CLASS = 100, 500, 100


def checks(path: Path) -> list[str]:
    """The published facts ``path`` fails (empty: it is CIFAR-100 as published); prints what it measured."""
    with np.load(path) as f:
        x_train, y_train, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
        names = list(f["class_names"])
    failed = []
    if len(names) != CLASSES:
        failed.append(f"{len(names)} classes, not {CLASSES}")
    for split, x, y, per_class in (("train", x_train, y_train, TRAIN_PER_CLASS), ("test", x_test, y_test, TEST_PER_CLASS)):
        if x.shape[1:] != (32, 32, 3):
            failed.append(f"{split} images are {x.shape[1:]}, not 32x32x3")
        counts = np.bincount(y, minlength=CLASSES)
        if not (counts == per_class).all():
            failed.append(f"{split} class counts {counts.min()}-{counts.max()}, not {per_class} each")
    mean, std = channel_statistics(x_train)
    print(f"train mean {' '.join(f'{v:.8f}' for v in mean)} (published {' '.join(map(str, PUBLISHED_MEAN))})")
    print(f"train std  {' '.join(f'{v:.8f}' for v in std)} (published {' '.join(map(str, PUBLISHED_STD))})")
    for what, ours, published in (("mean", mean, PUBLISHED_MEAN), ("std", std, PUBLISHED_STD)):
        gap = float(np.abs(ours - np.asarray(published)).max())
        if gap > STAT_TOLERANCE:
            failed.append(f"train {what} differs from the published value by {gap:.2e}")
    print(f"{len(x_train)} train / {len(x_test)} test images, {len(names)} classes: {names[0]} ... {names[-1]}")
    return failed


def extract(source: Path, into: Path) -> Path:
    """The tree to import: ``source`` itself when it holds train/ and test/, else those folders of
    ``source``'s HEAD (a git directory) written into ``into``."""
    return folders_root(source, ("train", "test"), into, "build_cifar100")


def main(argv: list[str] | None = None) -> int:
    """Extract, import with ``fedpers data import-folder``, check; exit 1 (and no file) when a check fails."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, type=Path, help="cyizhuo/CIFAR-100-dataset: a checkout or its git directory")
    p.add_argument("--out", required=True, type=Path, help="the .npz to write (refused when it exists)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cifar100-") as tmp:
        tree = extract(args.source, Path(tmp))
        done = subprocess.run([sys.executable, "-m", "fedpers", "data", "import-folder", str(tree), "--out",
                               str(args.out)], check=False)
        if done.returncode != 0:
            return done.returncode
    failed = checks(args.out)
    if failed:
        args.out.unlink()
        print("build_cifar100: not CIFAR-100 as published, file removed: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"build_cifar100: {args.out} checked: class counts and channel statistics as published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
