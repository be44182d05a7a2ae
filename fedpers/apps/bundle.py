"""The app bundle (FAB): what ``flwr run`` / ``flwr build`` send to the SuperLink and every SuperNode.

The bundle is the app: the packages the ServerApp (``fedpers.apps.server_app``) and the ClientApp
(``fedpers.apps.client_app``) import, ``fedpers/``, ``strategies/`` and ``clients/``, and ``pyproject.toml``;
never the repository's results, tests, docs or configs. Flower selects the files itself, by the
``fab-include`` list under ``[tool.flwr.app]`` (:data:`FAB_INCLUDE`, in ``pyproject.toml`` and in every app
directory :func:`write_app_code` fills), so ``flwr run .`` from a checkout, ``fedpers deploy local`` and the
compose stack's operator build the same bundle. Where it runs, Flower installs the bundle and puts it first
on ``sys.path``: its code is what the ServerApp and ClientApps run.

    python -m fedpers.apps.bundle [APP_DIR]     # one line: the bundle of APP_DIR (default: this checkout)
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import zipfile
from io import BytesIO
from pathlib import Path

from fedpers.core.errors import cut

APP_PACKAGES = ("fedpers", "strategies", "clients")
FAB_INCLUDE = [f"{package}/**/*.py" for package in APP_PACKAGES]
ROOT = Path(__file__).resolve().parents[2]


def package_sources() -> dict[str, Path]:
    """Every module of :data:`APP_PACKAGES` where this interpreter imports it from (a checkout, an editable
    or a wheel install): relative path in the bundle -> file."""
    found: dict[str, Path] = {}
    for package in APP_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"package {package} not found: install fedpers (pip install -e .)")
        base = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[f"{package}/{path.relative_to(base).as_posix()}"] = path
    return found


def write_app_code(directory: Path) -> Path:
    """Copy the app's packages (:func:`package_sources`) into ``directory``, an app directory whose
    ``pyproject.toml`` names :data:`FAB_INCLUDE`: ``flwr run`` of it then sends the bundle ``flwr build``
    makes of this checkout."""
    for relative, source in package_sources().items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return directory


def build(app_dir: str | Path = ROOT) -> bytes:
    """The bundle Flower builds of ``app_dir`` (``flwr build``'s own code, nothing written)."""
    from flwr.cli.build import build_fab_from_disk

    return build_fab_from_disk(Path(app_dir))


def contents(fab: bytes) -> dict[str, str]:
    """File in the bundle -> its SHA-256, without Flower's manifest ``.info/CONTENT``."""
    with zipfile.ZipFile(BytesIO(fab)) as archive:
        return {name: hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist()
                if not name.startswith(".info/")}


def describe(fab: bytes) -> str:
    """One line: how many files the bundle holds, its size, and its top-level entries."""
    names = contents(fab)
    tops = sorted({name.split("/")[0] + ("/" if "/" in name else "") for name in names})
    return f"app bundle: {len(names)} files, {len(fab) / 1024:.0f} KiB ({len(fab):,} bytes): {' '.join(tops)}"


def main(argv: list[str] | None = None) -> int:
    """Print :func:`describe` of the bundle of APP_DIR (default: this checkout)."""
    args = sys.argv[1:] if argv is None else argv
    app = Path(args[0]) if args else ROOT
    if not (app / "pyproject.toml").is_file():
        print(f"fedpers: error: {cut(str(app))} holds no pyproject.toml: not a Flower app directory", file=sys.stderr)
        return 2
    try:
        fab = build(app)
    except ValueError as exc:  # Flower's refusals (a pattern that matches nothing, over 10 MB, ...): one line
        print(f"fedpers: error: {cut(str(app))}: {cut(' '.join(str(exc).split()))}", file=sys.stderr)
        return 2
    print(describe(fab))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
