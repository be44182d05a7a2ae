"""The import graph of ``fedpers/``, ``strategies/`` and ``clients/``, read from the source (ast, nothing is
imported): every ``import``/``from ... import`` at any depth, and every ``"module:Attr"`` string (the
registry's class paths), is an edge. ``python -m tests.import_graph`` prints the cycles and the layer
violations; ``tests/test_layers.py`` requires both lists to be empty.

Layers, each importing only itself and the ones below it; a module's layer is its folder:
  apps      fedpers/apps/      the CLI, Flower's ServerApp and ClientApp, the simulation and in-process engines,
                               deployment, sweeps, reports (and ``python -m fedpers``, the deprecated shims)
  registry  fedpers/registry/  the methods (methods.py) and the validated config of a method (config.py)
  methods   strategies/, clients/ (and never each other)
  math      fedpers/algorithms/ each method's equations and config keys
  core      fedpers/core/      schema, data, partitions, models, training, results
A module of ``fedpers/`` outside these folders is an error (``stray_modules``), except the package itself,
``__main__`` and the deprecated shims (``SHIMS``), each of which may import only what it re-exports.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedpers", "strategies", "clients")
FOLDERS = {"fedpers.apps": "apps", "fedpers.registry": "registry", "fedpers.algorithms": "math", "fedpers.core": "core",
           "strategies": "methods", "clients": "methods"}
# deprecated import paths a user names in places we cannot rewrite (their pyproject, SuperExec commands,
# scripts), each -> the one module it re-exports
SHIMS = {"fedpers.app": "fedpers.apps.server_app", "fedpers.client_app": "fedpers.apps.client_app",
         "fedpers.cli": "fedpers.apps.cli"}
OUTSIDE = {"fedpers": "core", "fedpers.__main__": "apps", **{shim: "apps" for shim in SHIMS}}
RANK = {"core": 0, "math": 1, "methods": 2, "registry": 3, "apps": 4}
CLASS_PATH = re.compile(r"^((?:fedpers|strategies|clients)(?:\.\w+)+):\w+$")


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def layer_of(module: str) -> str:
    """The layer a module belongs to: its folder's (see the module docstring); "stray" for a module of
    ``fedpers/`` in no layer folder."""
    if module in OUTSIDE:
        return OUTSIDE[module]
    for folder, layer in FOLDERS.items():
        if module == folder or module.startswith(folder + "."):
            return layer
    return "stray"


def stray_modules(names) -> list[str]:
    """Modules in no layer folder (a new module must be put in the folder of its layer)."""
    return sorted(m for m in names if layer_of(m) == "stray")


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The known modules ``path`` imports (statements at any depth and "module:Attr" strings)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = CLASS_PATH.match(node.value)
            targets = [match.group(1)] if match else []
        out.update(t for t in targets if t in known)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (package ``__init__`` modules are not edges' targets of their
    own submodules' imports)."""
    files = modules()
    known = set(files)
    return {name: imports_of(path, known) - {name} for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Edges that go up a layer, or between ``strategies`` and ``clients``, modules in no layer folder, and
    shims that import more than the module they re-export."""
    bad = [f"{m} is in no layer folder ({', '.join(sorted(set(f.replace('.', '/') + '/' for f in FOLDERS)))})"
           for m in stray_modules(edges)]
    for shim, target in SHIMS.items():
        if shim in edges and edges[shim] != {target}:
            bad.append(f"{shim} (deprecated shim) imports {sorted(edges[shim])}, not only {target}")
    for source, targets in sorted(edges.items()):
        if source in SHIMS:
            continue
        for target in sorted(targets):
            if "stray" in (layer_of(source), layer_of(target)):
                continue
            src, dst = layer_of(source), layer_of(target)
            if RANK[dst] > RANK[src]:
                bad.append(f"{source} ({src}) imports {target} ({dst})")
            elif src == dst == "methods" and source.split(".")[0] != target.split(".")[0]:
                bad.append(f"{source} imports {target}: strategies/ and clients/ never import each other")
    return bad


def main() -> int:
    """Print the cycles and the layer violations; exit status 1 when there is any."""
    edges = graph()
    found, bad = cycles(edges), violations(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} edges")
    print(f"{len(found)} import cycle(s)")
    for component in found:
        print(f"  cycle of {len(component)}: {' '.join(component)}")
    print(f"{len(bad)} layer violation(s)")
    for line in bad:
        print("  " + line)
    return 1 if found or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
