"""Build Office-Caltech-10 as a ``.npz`` (the project's domain-dataset layout: ``d_train`` / ``d_test`` /
``domain_names``) at a chosen image size, and check it before it is used.

Source: the public GitHub repository redhat12345/OfficeCaltechDomainAdaptation (no licence file; the
images are Saenko et al.'s Office-31 and Griffin et al.'s Caltech-256, the 10-class selection of Gong et
al., CVPR 2012; cite them), ``images/<domain>/<class>/<file>.jpg`` with the domains amazon, caltech10,
dslr, webcam. Give it as a checkout or as the (bare) git directory a mirror of it is (read from HEAD with
``git archive``; nothing of it is run).

Names: the domain ``caltech10`` is called ``caltech``, the classes ``backpack`` / ``laptop`` are called
``back_pack`` / ``laptop_computer`` (Office-31's names); sorted, the ids are the same either way:
amazon 0, caltech 1, dslr 2, webcam 3; back_pack 0, bike 1, calculator 2, headphones 3, keyboard 4,
laptop_computer 5, monitor 6, mouse 7, mug 8, projector 9. With ``partition: domain`` and
``num_clients: 4``, client k holds domain k (the JDFL paper's one client per domain).

Split (ours: the dataset has no official train/test split): within every domain and class, the files are
ordered by the SHA-256 of ``"<seed>:"`` followed by the file's bytes (seed 0 by default, ``--split-seed``;
ties, which are identical files, by name) and the first ``round(0.2 n)`` are test, the rest train, the cut
moved past any copy of the last test image: a stratified 80/20 per domain and class that no library
version can change and that never puts one image (the repository holds 18 groups of byte-identical files
within amazon) on both sides. A temporary tree of symbolic links ``TREE/<split>/<domain>/<class>/<file>``
goes through ``fedpers data import-folder --domains --size N --resample bicubic`` (Pillow's bicubic, the
filter of shared/data/pacs.npz; images are squashed to N x N, not cropped: Caltech's are of many
shapes). Four Caltech images are grayscale and become RGB (three equal channels). The file is checked:

* the published image counts per domain: amazon 958, caltech 1123, dslr 157, webcam 295 (2,533);
* the per-class counts of this repository (``REPO_COUNTS``), and train + test = those counts;
* 10 classes, 4 domains, N x N RGB.

Exact duplicate files (same bytes) within and across domains are counted and reported, not removed.
A file that fails a check is removed and the script exits 1.

    python benchmarks/build_office_caltech.py \\
        --source /work/.mirror/redhat12345+OfficeCaltechDomainAdaptation/repo/.git --size 112 \\
        --out data/office_caltech112.npz
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from repo_images import folders_root  # benchmarks/repo_images.py, beside this script


DOMAINS = {"amazon": "amazon", "caltech10": "caltech", "dslr": "dslr", "webcam": "webcam"}  # repo -> ours
CLASSES = {"backpack": "back_pack", "bike": "bike", "calculator": "calculator", "headphones": "headphones",
           "keyboard": "keyboard", "laptop": "laptop_computer", "monitor": "monitor", "mouse": "mouse",
           "mug": "mug", "projector": "projector"}
PUBLISHED_TOTALS = {"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295}
# per domain, in sorted class order (back_pack ... projector): the repository's images
REPO_COUNTS = {
    "amazon": (92, 82, 94, 99, 100, 100, 99, 100, 94, 98),
    "caltech": (151, 110, 100, 138, 85, 128, 133, 94, 87, 97),
    "dslr": (12, 21, 12, 13, 10, 24, 22, 12, 8, 23),
    "webcam": (29, 21, 31, 27, 27, 30, 43, 30, 27, 30),
}
TEST_SHARE = 0.2


def extract(source: Path, into: Path) -> Path:
    """The folder holding ``<domain>/<class>/<file>``: ``source/images`` of a checkout, else ``source``'s HEAD
    (a git directory) written into ``into``."""
    return folders_root(source, ("images",), into, "build_office_caltech") / "images"


def split_files(images: Path, seed: int) -> dict[str, dict[tuple[str, str], list[Path]]]:
    """``{"train"|"test": {(domain, class): [file, ...]}}`` (ours, module docstring), by our names."""
    out: dict[str, dict[tuple[str, str], list[Path]]] = {"train": {}, "test": {}}
    found = sorted(p.name for p in images.iterdir() if p.is_dir())
    if found != sorted(DOMAINS):
        sys.exit(f"build_office_caltech: {images} holds domains {found}, not {sorted(DOMAINS)}")
    for repo_domain, domain in DOMAINS.items():
        classes = sorted(p.name for p in (images / repo_domain).iterdir() if p.is_dir())
        if classes != sorted(CLASSES):
            sys.exit(f"build_office_caltech: {images / repo_domain} holds classes {classes}, not {sorted(CLASSES)}")
        for repo_class, cls in CLASSES.items():
            keyed = sorted((hashlib.sha256(f"{seed}:".encode() + p.read_bytes()).hexdigest(), p.name, p)
                           for p in (images / repo_domain / repo_class).iterdir() if p.is_file())
            files = [p for _, _, p in keyed]
            n_test = int(round(TEST_SHARE * len(files)))
            while 0 < n_test < len(files) and keyed[n_test][0] == keyed[n_test - 1][0]:
                n_test += 1  # a copy of the last test image stays in test
            out["test"][(domain, cls)], out["train"][(domain, cls)] = files[:n_test], files[n_test:]
    return out


def link_tree(split: dict[str, dict[tuple[str, str], list[Path]]], tree: Path) -> None:
    """``tree/<split>/<domain>/<class>/<file>`` as symbolic links to the extracted files."""
    for name, groups in split.items():
        for (domain, cls), files in groups.items():
            folder = tree / name / domain / cls
            folder.mkdir(parents=True, exist_ok=True)
            for f in files:
                (folder / f.name).symlink_to(f)


def duplicates(images: Path, split: dict[str, dict[tuple[str, str], list[Path]]]) -> dict:
    """Exact duplicate files (same bytes): groups within a domain, across domains, and across our train /
    test split (the same image on both sides)."""
    side = {str(f.relative_to(images)): name for name, groups in split.items() for files in groups.values()
            for f in files}
    by_hash: dict[str, list[str]] = {}
    for p in sorted(images.rglob("*")):
        if p.is_file():
            by_hash.setdefault(hashlib.sha256(p.read_bytes()).hexdigest(), []).append(str(p.relative_to(images)))
    groups = [g for g in by_hash.values() if len(g) > 1]
    within = sum(1 for g in groups if len({x.split("/")[0] for x in g}) == 1)
    straddling = sum(1 for g in groups if len({side[x] for x in g}) > 1)
    return {"groups": len(groups), "within_one_domain": within, "across_domains": len(groups) - within,
            "in_train_and_test": straddling, "examples": groups[:5]}


def checks(path: Path, size: int) -> tuple[list[str], dict]:
    """The facts ``path`` fails (empty: Office-Caltech-10 as published) and what was measured."""
    failed: list[str] = []
    with np.load(path) as f:
        domains, classes = [str(d) for d in f["domain_names"]], [str(c) for c in f["class_names"]]
        if domains != sorted(PUBLISHED_TOTALS):
            failed.append(f"domains {domains}, not {sorted(PUBLISHED_TOTALS)}")
        if classes != sorted(CLASSES.values()):
            failed.append(f"classes {classes}, not {sorted(CLASSES.values())}")
        for split in ("train", "test"):
            if f[f"x_{split}"].shape[1:] != (size, size, 3):
                failed.append(f"{split} images are {f[f'x_{split}'].shape[1:]}, not {size}x{size}x3")
        if failed:
            return failed, {}
        measured = {}
        for di, d in enumerate(domains):
            train = np.bincount(f["y_train"][f["d_train"] == di], minlength=len(classes))
            test = np.bincount(f["y_test"][f["d_test"] == di], minlength=len(classes))
            total = train + test
            measured[d] = {"train": int(train.sum()), "test": int(test.sum()), "per_class_total": total.tolist(),
                           "per_class_test": test.tolist()}
            if int(total.sum()) != PUBLISHED_TOTALS[d]:
                failed.append(f"{d}: {int(total.sum())} images, not the published {PUBLISHED_TOTALS[d]}")
            if tuple(total.tolist()) != REPO_COUNTS[d]:
                failed.append(f"{d}: class counts {total.tolist()}, not {list(REPO_COUNTS[d])}")
    return failed, measured


def main(argv: list[str] | None = None) -> int:
    """Extract, split, link, import with ``fedpers data import-folder``, check; exit 1 (no file) on a failure."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, type=Path,
                   help="redhat12345/OfficeCaltechDomainAdaptation: a checkout or its git directory")
    p.add_argument("--size", type=int, default=112, help="image side in pixels (default 112, the JDFL paper's)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of our 80/20 split (default 0)")
    p.add_argument("--out", required=True, type=Path, help="the .npz to write (refused when it exists)")
    p.add_argument("--report", type=Path, default=None, help="write what was measured as JSON here")
    args = p.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="office-caltech-") as tmp:
        images = extract(args.source, Path(tmp))
        split = split_files(images, args.split_seed)
        dup = duplicates(images, split)
        tree = Path(tmp) / "tree"
        link_tree(split, tree)
        done = subprocess.run([sys.executable, "-m", "fedpers", "data", "import-folder", str(tree), "--out",
                               str(args.out), "--domains", "--size", str(args.size), "--resample", "bicubic"],
                              check=False)
        if done.returncode != 0:
            return done.returncode
    seconds = time.perf_counter() - started
    failed, measured = checks(args.out, args.size)
    if failed:
        args.out.unlink()
        print("build_office_caltech: not Office-Caltech-10 as published, file removed: " + "; ".join(failed),
              file=sys.stderr)
        return 1
    n_train = sum(m["train"] for m in measured.values())
    n_test = sum(m["test"] for m in measured.values())
    print(f"build_office_caltech: {args.out} checked: {n_train} train / {n_test} test images of "
          f"{args.size}x{args.size}x3; per domain (train/test) "
          + ", ".join(f"{d} {m['train']}/{m['test']}" for d, m in measured.items())
          + f"; exact duplicate files: {dup['groups']} groups ({dup['within_one_domain']} within a domain, "
          f"{dup['across_domains']} across, {dup['in_train_and_test']} in train and test); {seconds:.0f} s, "
          f"{args.out.stat().st_size / 1e6:.0f} MB")
    if args.report is not None:
        args.report.write_text(json.dumps({"out": str(args.out), "size": args.size, "split_seed": args.split_seed,
                                           "build_seconds": round(seconds, 1), "domains": measured,
                                           "duplicates": dup}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
