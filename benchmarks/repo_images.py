"""Image folders of a public repository, from a checkout or from a bare git directory (a mirror), for the
dataset build scripts (build_cifar100.py, build_pacs.py, build_office_caltech.py). Nothing of the
repository is run: its files are read, at ``HEAD`` where it is a git directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def folders_root(source: Path, folders: tuple[str, ...], into: Path, who: str) -> Path:
    """A folder holding every one of ``folders``: ``source`` itself when it does (a checkout), else
    ``into``, where ``git archive`` writes those folders of ``source``'s ``HEAD`` (a git directory). A
    source that is neither ends the script with one line naming it (``who``: the script's name)."""
    if all((source / name).is_dir() for name in folders):
        return source
    archive = subprocess.run(["git", "--git-dir", str(source), "archive", "--format=tar", "HEAD", *folders],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        sys.exit(f"{who}: {source} holds no {' and '.join(f + '/' for f in folders)} and is no git directory that "
                 f"does ({archive.stderr.decode(errors='replace').strip()})")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into
