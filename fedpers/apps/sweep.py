"""Sweeps: the cross product methods x datasets x alpha x seeds, run one after another, resumable.

A sweep file (YAML)::

    base: {rounds: 50, local_epochs: 2}          # config keys shared by every run
    datasets: [../shared/data/mnist.npz]
    alphas: [0.05, 0.1, 0.5]
    seeds: [0, 1, 2]
    methods:
      - fedavg                                    # label = method name, metric = the method's own
      - {label: pFedKDH-Fair, method: pfedkdh, set: {variant: ea}, metric: personalized_macro_acc_fair}
      - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}
      - {label: FedBABU 1 ep, method: fedbabu, set: {fedbabu_finetune_also: "1"}, metric: personalized_macro_acc_ft1,
         group: FedBABU}                          # validation.md chooses within a group (default: method + metric)
      - {label: FedPer, method: fedper, seeds: [0, 1, 2, 3, 4]}   # a row's own seeds replace the file's
    ablation: false                               # true: `fedpers report` also draws the bar chart
    report: {value: best, versus: [FedPer]}       # how `fedpers report DIR` reads this study unless told
                                                  # otherwise: value final | best | last5, versus rows, metric

A row's ``seeds`` declares a study whose rows do not all get the same number of seeds (more seeds for the
rows a claim compares); the report shows each cell's number of finished seeds where the rows differ.

Rows that differ only in label/metric share their runs (pFedKDH-Fair and -EA come from one run).

A study that runs part of a table another sweep file declares reads it instead of restating it::

    extends: ../../configs/sweeps/pfedkdh_table2.yaml   # relative to this file
    rows: [FedAvg, FedPer, pFedKDH-EA]           # the rows it runs, in this order (default: all), or a
                                                  # mapping {its label: the declared label} to rename them
    base: {eval_every: 5}                        # merged over the declared base
    datasets: [mnist]                             # datasets, alphas, seeds, ablation: replaced if given
                                                  # (seeds: every chosen row's own seeds too)
    methods: [...]                                # rows of its own, after the chosen ones

The chosen rows keep their keys, metric, group and paper numbers (``paper`` entries of the study are
added); the declared claims come along where their column is one of the study's and each row they
name is chosen (renamed with the rows); the study's own ``claims`` follow them.
Every run's config is validated before the first run starts. A run whose ``summary.json`` exists is
skipped, and every run checkpoints after each round (:func:`resumable`), so an interrupted sweep resumes
where it stopped: at the next run, or inside the interrupted one after its last finished round.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import string
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fedpers.registry.config import build_config, ignored_key_names, read_config_file
from fedpers.core.data import find_dataset
from fedpers.core.errors import ConfigError, FedpersError, shown
from fedpers.core.state_store import MECHANICS_KEYS


@dataclass(frozen=True)
class MethodEntry:
    """One row of the paper-style table."""

    label: str
    method: str
    set: dict[str, Any] = field(default_factory=dict)
    metric: str | None = None  # None: the method's headline metric (summary["metric"])
    # rows with the same group are one choice in the report's validation.md (None: rows of the same method
    # and metric), e.g. FedBABU's rows reading personalized_macro_acc_ft<e> of one run
    group: str | None = None
    # the seeds this row is run at (None: the sweep's), for studies that give some rows more seeds
    seeds: tuple[int, ...] | None = None

    @property
    def run_key(self) -> str:
        """Directory name shared by rows with the same method and overrides: ``<method>_<key>=<value>...``,
        each value as :func:`name_part` writes it."""
        extra = "".join(f"_{k}={name_part(v)}" for k, v in sorted(self.set.items()))
        return f"{name_part(self.method)}{extra}"

    @property
    def legacy_run_key(self) -> str:
        """The name :attr:`run_key` had before run directories were named by :func:`name_part` (values
        as written, ``/`` as ``-``): where an older sweep left this row's runs."""
        extra = "".join(f"_{k}={v}" for k, v in sorted(self.set.items()))
        return f"{self.method}{extra}".replace("/", "-")


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    methods: list[MethodEntry]
    datasets: list[str]
    alphas: list[float]
    seeds: list[int]
    base: dict[str, Any] = field(default_factory=dict)
    ablation: bool = False
    # the paper's numbers, for the report's side-by-side columns: label -> {"<dataset>_a<alpha>": accuracy %}
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    # the paper's claims in checkable form (fedpers/apps/claims.py), as written in the study file
    claims: list[dict[str, Any]] = field(default_factory=list)
    # how `fedpers report` reads the study when its command line does not say: value, versus, metric
    report: dict[str, Any] = field(default_factory=dict)

    def seeds_of(self, entry: MethodEntry) -> list[int]:
        """The seeds ``entry`` is run at: its own, else the sweep's."""
        return list(entry.seeds) if entry.seeds is not None else self.seeds

    @property
    def all_seeds(self) -> list[int]:
        """Every seed some row is run at: the sweep's, then the rows' own, in order of first mention."""
        return list(dict.fromkeys([*self.seeds, *(s for m in self.methods for s in self.seeds_of(m))]))

    @property
    def columns(self) -> list[str]:
        """The table's columns, as claims and the paper table name them: ``<dataset>_a<alpha>``."""
        return [f"{dataset_tag(d)}_a{a:g}" for d in self.datasets for a in self.alphas]


@dataclass(frozen=True)
class PlannedRun:
    """One experiment of a sweep."""

    run_key: str
    dataset: str
    alpha: float
    seed: int
    run_dir: str
    overrides: dict[str, Any]


def dataset_tag(dataset: str) -> str:
    """Short name of a dataset (file stem for paths)."""
    return Path(dataset).stem if dataset.endswith(".npz") else dataset


# The characters a run directory's name keeps as they are: POSIX's portable file-name characters. The
# others break some tool that carries the name: Flower's app-bundle manifest is one `path,hash,size` line
# per file (a comma in a path stops `flwr run`), shells split at spaces and expand `~`, `*`, `$`, and URLs
# give `%`, `?`, `#`, `+` and `,` meanings of their own.
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
LIST_SEPARATOR = "+"  # a comma of a list value ("1,2,10" -> 1+2+10)
ESCAPE = "@"  # any other character: @ and its UTF-8 bytes in hex ("/" -> @2f, a "+" of the value -> @2b)


def name_part(value: Any) -> str:
    """``value`` as a part of a run directory's name (a row's ``set`` values, a dataset's tag, an alpha):
    its text with each comma, the separator of a list value (``ea_also: "50,1ep"``), as ``+``, and each
    other character outside ``A-Z a-z 0-9 . _ -`` as ``@`` and its UTF-8 bytes in hex (``/`` -> ``@2f``).
    Readable for the values rows set (numbers, names, lists) and reversible (:func:`value_of_name_part`):
    two values never share a directory, and a list never reads as a scalar (``"1+2"`` is ``1@2b2``)."""
    out = []
    for char in str(value):
        if char in NAME_CHARS:
            out.append(char)
        elif char == ",":
            out.append(LIST_SEPARATOR)
        else:
            out.extend(f"{ESCAPE}{byte:02x}" for byte in char.encode())
    return "".join(out)


def value_of_name_part(part: str) -> str:
    """The text :func:`name_part` made ``part`` from (``1+2+10`` -> ``"1,2,10"``, ``a@2fb`` -> ``"a/b"``)."""
    out = bytearray()
    i = 0
    while i < len(part):
        if part[i] == LIST_SEPARATOR:
            out += b","
        elif part[i] == ESCAPE:
            out += bytes.fromhex(part[i + 1:i + 3])
            i += 2
        else:
            out += part[i].encode()
        i += 1
    return out.decode()


def _as_list(raw: dict, key: str, path: Path) -> list:
    value = raw.get(key)
    if value is None:
        raise ConfigError(f"sweep {path}: missing '{key}'")
    return value if isinstance(value, list) else [value]


def _numbers(raw: dict, key: str, path: Path, kind: type, where: str = "") -> list:
    """The sweep's ``key`` list (of the entry ``where`` names, else of the file) as numbers of ``kind``;
    anything else is one clear line."""
    out = []
    for value in _as_list(raw, key, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is int and isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"sweep {path}: {where}'{key}' must list {'integers' if kind is int else 'numbers'}, "
                              f"got {shown(value)}")
        try:
            out.append(kind(value))
        except OverflowError:  # an integer beyond float's range, or an infinite seed
            raise ConfigError(f"sweep {path}: {where}'{key}' lists {shown(value)}, out of range") from None
    return out


def _paper_numbers(raw: Any, path: Path) -> dict[str, dict[str, float]]:
    """The sweep's ``paper`` entry: ``{label: {"<dataset>_a<alpha>": accuracy in %}}``."""
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"sweep {path}: 'paper' must map a method label to {{<dataset>_a<alpha>: accuracy %}}")
    out: dict[str, dict[str, float]] = {}
    for label, cells in raw.items():
        for column, value in cells.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"sweep {path}: paper value of {label} {column} must be a number, got {value!r}")
            out.setdefault(str(label), {})[str(column)] = float(value)
    return out


def _keys(raw: Any, where: str, path: Path) -> dict[str, Any]:
    """A sweep's mapping of config keys (``base``, a method's ``set``): scalars under names."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep {path}: '{where}' must be a mapping of config key: value, got "
                          f"{type(raw).__name__} {shown(raw)}")
    for name, value in raw.items():
        if isinstance(value, (list, dict)):
            raise ConfigError(f"sweep {path}: '{where}' key {shown(str(name))} must be a single value, "
                              f"got {type(value).__name__}")
    return {str(name): value for name, value in raw.items()}


SWEEP_ENTRIES = {"base", "methods", "datasets", "alphas", "seeds", "ablation", "paper", "claims", "report"}
METHOD_ENTRIES = {"label", "method", "set", "metric", "group", "seeds"}


def _report_options(raw: Any, labels: list[str], p: Path) -> dict[str, Any]:
    """A study's ``report:`` mapping, checked: ``value`` (final | best | last5), ``versus`` (row labels),
    ``metric`` (one accuracy for every row)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep {p}: 'report' is a mapping {{value: ..., versus: [ROW, ...], metric: ...}}")
    unknown = set(map(str, raw)) - {"value", "versus", "metric"}
    if unknown:
        raise ConfigError(f"sweep {p}: report: unknown entries {shown(sorted(unknown))} (value, versus, metric)")
    from fedpers.apps.claims import CLAIM_VALUES

    out: dict[str, Any] = {}
    if "value" in raw:
        if raw["value"] not in CLAIM_VALUES:
            raise ConfigError(f"sweep {p}: report: 'value' must be one of final, best, last5, got {shown(raw['value'])}")
        out["value"] = raw["value"]
    if "versus" in raw:
        versus = raw["versus"] if isinstance(raw["versus"], list) else [raw["versus"]]
        missing = [str(v) for v in versus if str(v) not in labels]
        if missing:
            raise ConfigError(f"sweep {p}: report: versus {shown(missing)} is not a row of the study")
        out["versus"] = [str(v) for v in versus]
    if "metric" in raw:
        if not isinstance(raw["metric"], str) or not raw["metric"]:
            raise ConfigError(f"sweep {p}: report: 'metric' must be a metric name, got {shown(raw['metric'])}")
        out["metric"] = raw["metric"]
    return out


def _claim_rows(claim: dict) -> list[str]:
    """The row labels a claim names (its ``order`` list, its ``delta`` rows, its ``within`` rows)."""
    if "order" in claim and isinstance(claim["order"], list):
        return [str(r) for r in claim["order"]]
    if isinstance(claim.get("delta"), dict):
        return [str(claim["delta"].get(k)) for k in ("a", "b")]
    if isinstance(claim.get("within"), dict) and claim["within"].get("rows", "all") != "all":
        rows = claim["within"]["rows"]
        return [str(r) for r in (rows if isinstance(rows, list) else [rows])]
    return []


def _renamed_claim(claim: dict, names: dict[str, str]) -> dict:
    """``claim`` with its rows renamed (declared label -> the study's)."""
    out = dict(claim)
    if "order" in out:
        out["order"] = [names[str(r)] for r in out["order"]]
    elif isinstance(out.get("delta"), dict):
        out["delta"] = {**out["delta"], **{k: names[str(out["delta"][k])] for k in ("a", "b") if k in out["delta"]}}
    elif isinstance(out.get("within"), dict) and out["within"].get("rows", "all") != "all":
        rows = out["within"]["rows"]
        out["within"] = {**out["within"], "rows": [names[str(r)] for r in (rows if isinstance(rows, list) else [rows])]}
    return out


def _extended(raw: dict, p: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A sweep file's entries with ``extends`` / ``rows`` resolved (see the module docstring)."""
    parent_path = (p.parent / str(raw["extends"])).resolve()
    if parent_path in seen or parent_path == p.resolve():
        raise ConfigError(f"sweep {p}: 'extends' makes a loop through {parent_path}")
    parent = read_config_file(parent_path, f"sweep file (extended by {p})")
    if not isinstance(parent, dict):
        raise ConfigError(f"sweep {parent_path} (extended by {p}) must be a mapping")
    if "extends" in parent:
        parent = _extended(parent, parent_path, seen + (p.resolve(),))
    declared = [m if isinstance(m, dict) else {"method": m} for m in _as_list(parent, "methods", parent_path)]
    by_label = {str(m.get("label", m.get("method"))): m for m in declared}
    chosen = raw.get("rows")
    if chosen is None:
        names = {label: label for label in by_label}
    elif isinstance(chosen, list):
        names = {str(label): str(label) for label in chosen}
    elif isinstance(chosen, dict):
        names = {str(declared_label): str(label) for label, declared_label in chosen.items()}
    else:
        raise ConfigError(f"sweep {p}: 'rows' lists labels of {parent_path.name} or maps a label to one, "
                          f"got {shown(chosen)}")
    unknown = [label for label in names if label not in by_label]
    if unknown:
        raise ConfigError(f"sweep {p}: 'rows' names {shown(unknown)}, not rows of {parent_path.name} "
                          f"({', '.join(by_label)})")
    out = {key: raw.get(key, parent.get(key)) for key in ("datasets", "alphas", "seeds", "ablation", "report")}
    out = {k: v for k, v in out.items() if v is not None}
    out["base"] = {**(parent.get("base") or {}), **(raw.get("base") or {})}
    # the study's seeds replace the declared rows' own: a plan file running seed 3 of a row runs seed 3
    own_seeds = {"seeds": None} if "seeds" in raw else {}
    out["methods"] = ([{**by_label[label], "label": new, **own_seeds} for label, new in names.items()]
                      + list(raw.get("methods") or []))
    paper = {names[label]: cells for label, cells in (parent.get("paper") or {}).items() if label in names}
    for label, cells in (raw.get("paper") or {}).items():
        paper[str(label)] = {**paper.get(str(label), {}), **(cells or {})}
    out["paper"] = paper
    columns = {f"{dataset_tag(str(d))}_a{float(a):g}" for d in _as_list(out, "datasets", p) for a in _as_list(out, "alphas", p)}
    claims = []
    for claim in parent.get("claims") or []:
        column = claim.get("column") if isinstance(claim, dict) else None
        if not isinstance(claim, dict) or (column not in columns if column else len(columns) != 1):
            continue
        if all(row in names for row in _claim_rows(claim)):
            claims.append(_renamed_claim(claim, names))
    out["claims"] = claims + list(raw.get("claims") or [])
    return out


def load_sweep(path: str | Path, sets: list[str] | None = None, datasets: list[str] | None = None) -> Sweep:
    """Parse and validate a sweep file; ``sets`` (``key=value``) override its ``base`` and ``datasets``
    its dataset list. Every run's config is checked by the config schema."""
    p = Path(path)
    raw = read_config_file(p, "sweep file")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep file {p} must be a mapping (base, methods, datasets, alphas, seeds), "
                          f"got {type(raw).__name__}")
    own_paper = raw.get("paper") or {}  # an extended declaration's numbers may cover columns this study leaves out
    if "extends" in raw:
        unknown = set(map(str, raw)) - SWEEP_ENTRIES - {"extends", "rows"}
        if unknown:
            raise ConfigError(f"sweep {p}: unknown entries {shown(sorted(unknown))}")
        raw = _extended(raw, p)
    elif "rows" in raw:
        raise ConfigError(f"sweep {p}: 'rows' chooses rows of the file named by 'extends', and there is none")
    unknown = set(map(str, raw)) - SWEEP_ENTRIES
    if unknown:
        raise ConfigError(f"sweep {p}: unknown entries {shown(sorted(unknown))}")
    methods = []
    for item in _as_list(raw, "methods", p):
        if isinstance(item, str):
            methods.append(MethodEntry(item, item))
        elif isinstance(item, dict) and isinstance(item.get("method"), str):
            label = str(item.get("label", item["method"]))
            unknown = set(map(str, item)) - METHOD_ENTRIES
            if unknown:
                raise ConfigError(f"sweep {p}: row {label}: unknown entries {shown(sorted(unknown))} "
                                  f"(a row has {', '.join(sorted(METHOD_ENTRIES))}; config keys go under 'set')")
            seeds = (None if item.get("seeds") is None
                     else tuple(_numbers(item, "seeds", p, int, f"row {label}: ")))
            if seeds == ():
                raise ConfigError(f"sweep {p}: row {label}: 'seeds' is empty (leave it out to run the file's seeds)")
            methods.append(MethodEntry(label, item["method"], _keys(item.get("set"), f"{label}: set", p),
                                       item.get("metric"), None if item.get("group") is None else str(item["group"]),
                                       seeds))
        else:
            raise ConfigError(f"sweep {p}: a method entry must be a name or a mapping with 'method', got "
                              f"{shown(item)}")
    from fedpers.registry.config import coerce_value, full_schema, parse_set_arguments

    known = full_schema().by_name  # --set values are text: stored with the key's type, as the file's are
    base = {**_keys(raw.get("base"), "base", p),
            **{k: coerce_value(known[k], v) if k in known else v for k, v in parse_set_arguments(sets or []).items()}}
    sweep = Sweep(methods, [str(d) for d in (datasets or _as_list(raw, "datasets", p))],
                  _numbers(raw, "alphas", p, float), _numbers(raw, "seeds", p, int),
                  base, bool(raw.get("ablation", False)), _paper_numbers(raw.get("paper") or {}, p),
                  raw.get("claims") or [])
    labels = [m.label for m in sweep.methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"sweep {p}: method labels must be unique, got {labels}")
    sweep = replace(sweep, report=_report_options(raw.get("report"), labels, p))
    for key, values in (("methods", sweep.methods), ("datasets", sweep.datasets), ("alphas", sweep.alphas),
                        ("seeds", sweep.seeds)):
        if not values:
            raise ConfigError(f"sweep {p}: '{key}' is empty: a study lists at least one")
    for label, cells in _paper_numbers(own_paper, p).items():
        if label not in labels:
            raise ConfigError(f"sweep {p}: 'paper' gives numbers for {shown(label)}, not a row of the study "
                              f"(rows: {', '.join(labels)})")
        unknown_columns = sorted(set(cells) - set(sweep.columns))
        if unknown_columns:
            raise ConfigError(f"sweep {p}: 'paper' gives {label} numbers for {', '.join(unknown_columns)}, not a "
                              f"column of the study (columns: {', '.join(sweep.columns)})")
    from fedpers.apps.claims import parse_claims

    parse_claims(raw.get("claims"), labels, sweep.columns, sweep.paper, f"sweep {p}")
    for run in plan(sweep, "/tmp/fedpers-sweep-check"):
        try:
            build_config(run.overrides)
        except ConfigError as exc:
            raise ConfigError(f"sweep {p}, run {run.run_key}/{dataset_tag(run.dataset)}: {exc}") from None
    return sweep


def check_datasets(sweep: Sweep, path: str | Path) -> None:
    """Every run's dataset can be found (:func:`fedpers.core.data.find_dataset`: a name that is no dataset, a
    missing file or ``data_dir``), before the first run starts: a typo in the last dataset of the list
    would otherwise be found after the runs of the others. Not part of :func:`load_sweep`: a sweep's
    report and its file's validity need no data on this machine."""
    checked: set[tuple[str, str]] = set()
    for run in plan(sweep, "/tmp/fedpers-sweep-check"):
        cfg = build_config(run.overrides)
        if (cfg.dataset, cfg.data_dir) in checked:
            continue
        try:
            find_dataset(cfg.dataset, cfg.data_dir)
        except FedpersError as exc:
            raise ConfigError(f"sweep {path}, run {run.run_key}/{dataset_tag(run.dataset)}: {exc}") from None
        checked.add((cfg.dataset, cfg.data_dir))


def run_dir_of(out: str | Path, run_key: str, dataset: str, alpha: float, seed: int) -> Path:
    """Where a sweep in ``out`` keeps one run."""
    column = f"{name_part(dataset_tag(dataset))}_a{name_part(f'{alpha:g}')}"
    return Path(out) / "runs" / run_key / column / f"seed{seed}"


def legacy_run_dir_of(out: str | Path, entry: MethodEntry, dataset: str, alpha: float, seed: int) -> Path:
    """Where a sweep before :func:`name_part` kept the run of ``entry`` (:attr:`MethodEntry.legacy_run_key`)."""
    return Path(out) / "runs" / entry.legacy_run_key / f"{dataset_tag(dataset)}_a{alpha:g}" / f"seed{seed}"


def move_legacy_run_dirs(sweep: Sweep, out: str | Path) -> list[tuple[Path, Path]]:
    """Move each run an older sweep in ``out`` left under its former name (a comma or a slash in a value:
    :attr:`MethodEntry.legacy_run_key`) to the name the plan gives it now, so the sweep finds it finished or
    resumes it instead of running it again; a run the new name already holds is left where it is. Each
    move holds the run's lock (a run still writing there is refused, as a second run would be). Returns
    the moves made, (old, new)."""
    from fedpers.core.rundir import RunLock

    out = Path(out)
    moved = []
    for entry in sweep.methods:
        for seed in sweep.seeds_of(entry):
            for dataset in sweep.datasets:
                for alpha in sweep.alphas:
                    old = legacy_run_dir_of(out, entry, dataset, alpha, seed)
                    new = run_dir_of(out, entry.run_key, dataset, alpha, seed)
                    if old == new or not old.is_dir() or new.exists():
                        continue
                    with RunLock(old):
                        new.parent.mkdir(parents=True, exist_ok=True)
                        os.rename(old, new)
                    moved.append((old, new))
                    for parent in (old.parent, old.parent.parent):  # the alpha and run-key levels, once empty
                        with contextlib.suppress(OSError):
                            parent.rmdir()
    return moved


def report_moves(moved: list[tuple[Path, Path]], out: str | Path, who: str) -> None:
    """One line per run :func:`move_legacy_run_dirs` moved."""
    for old, new in moved:
        print(f"{who} | renamed {old.relative_to(out)} -> {new.relative_to(out)} (run directory names: "
              "docs/running.md)", flush=True)


def plan(sweep: Sweep, out: str | Path) -> list[PlannedRun]:
    """Every distinct run of the sweep, in a stable order: a whole table column (every method of one
    seed, dataset and alpha) before the next, so that an unfinished sweep leaves whole columns; a row with
    its own seeds runs at those only."""
    runs: dict[tuple, PlannedRun] = {}
    for seed in sweep.all_seeds:
        for dataset in sweep.datasets:
            for alpha in sweep.alphas:
                for entry in sweep.methods:
                    if seed not in sweep.seeds_of(entry):
                        continue
                    run_dir = run_dir_of(out, entry.run_key, dataset, alpha, seed)
                    overrides = {**sweep.base, "method": entry.method, **entry.set, "dataset": dataset,
                                 "alpha": alpha, "seed": seed, "out_dir": str(run_dir)}
                    key = (entry.run_key, dataset, alpha, seed)
                    runs.setdefault(key, PlannedRun(entry.run_key, dataset, alpha, seed, str(run_dir), overrides))
    return list(runs.values())


def write_plan(sweep: Sweep, out: str | Path) -> Path:
    """Save the sweep definition next to its runs (``sweep.json``), for ``fedpers report``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.json"
    path.write_text(json.dumps({"sweep": asdict(sweep), "runs": [asdict(r) for r in plan(sweep, out)]}, indent=2))
    return path


def read_plan(out: str | Path) -> tuple[Sweep, list[PlannedRun]]:
    """Inverse of :func:`write_plan`, with every run found under ``out`` itself: a sweep directory copied or
    moved elsewhere (committed results, another machine) still holds its runs, wherever they were run."""
    path = Path(out) / "sweep.json"
    if not path.is_file():
        raise ConfigError(f"{out} holds no sweep.json: run `fedpers sweep` first")
    try:
        raw = json.loads(path.read_text())
        s = raw["sweep"]
        sweep = Sweep([MethodEntry(**{**m, "seeds": None if m.get("seeds") is None else tuple(m["seeds"])})
                       for m in s["methods"]], s["datasets"], s["alphas"], s["seeds"], s["base"],
                      s["ablation"], s.get("paper", {}), s.get("claims", []), s.get("report", {}))
        runs = [PlannedRun(**r) for r in raw["runs"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a sweep.json written by `fedpers sweep` ({type(exc).__name__}); "
                          "run `fedpers sweep` again to rewrite it") from None
    # A plan written before run directories were named by name_part names its runs by their former
    # names: each is the run of the row whose name it was, found under the name its directory has.
    by_key = {m.run_key: m for m in sweep.methods}
    by_legacy = {m.legacy_run_key: m for m in sweep.methods}
    found = []
    for r in runs:
        entry = by_key.get(r.run_key) or by_legacy.get(r.run_key)
        key = entry.run_key if entry is not None else r.run_key
        run_dir = run_dir_of(out, key, r.dataset, r.alpha, r.seed)
        if entry is not None and not run_dir.exists():
            legacy = legacy_run_dir_of(out, entry, r.dataset, r.alpha, r.seed)
            run_dir = legacy if legacy.exists() else run_dir
        found.append(replace(r, run_key=key, run_dir=str(run_dir)))
    return sweep, found


# Keys a finished run and its plan may differ in: where and how it ran, and where its data lies
# (``--set data_dir=...`` on one machine, the default search path on another).
_NOT_COMPARED = MECHANICS_KEYS | {"data_dir"}


def recorded_differences(run: PlannedRun, recorded: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The experiment's keys whose value in a finished run (``recorded``: its ``summary.json``'s ``config``)
    differs from what the plan gives that run today: ``{key: (recorded, planned)}``, over the keys the run
    reads (not another method's). A key the run did not record (added to the schema later) differs only
    where the plan moves it off its default. Empty when the run is the planned experiment; not, e.g., when a
    default changed after the run and the plan does not pin the value the run was made with."""
    config = build_config(run.overrides)
    planned = json.loads(json.dumps(config.to_dict(), default=str))  # as summary.json records it
    defaults = json.loads(json.dumps(config.defaults(), default=str))
    unread = _NOT_COMPARED | set(ignored_key_names(config, planned))
    return {key: (recorded.get(key, "not recorded"), value) for key, value in planned.items()
            if key not in unread and (recorded[key] != value if key in recorded else value != defaults[key])}


def check_finished_runs(runs: list[PlannedRun], who: str) -> None:
    """Refuse (one line naming the run and the keys) a plan whose finished run is another experiment than
    the plan says, before anything is run or written: a sweep would skip it and a report would show it as
    the row it is not. Runs without ``summary.json``, or whose summary records no config, are not checked."""
    for run in runs:
        path = Path(run.run_dir) / "summary.json"
        if not path.is_file():
            continue
        try:
            recorded = json.loads(path.read_text()).get("config")
        except (ValueError, UnicodeDecodeError, AttributeError):
            continue  # a torn or foreign file: the report's own check names it
        if not isinstance(recorded, dict):
            continue
        try:
            differ = recorded_differences(run, recorded)
        except ConfigError as exc:  # a plan written before a key was renamed or removed
            raise ConfigError(f"{who}: the plan of {run.run_dir} is not a valid config today ({exc}); "
                              "run `fedpers sweep` with its study file again to rewrite the plan") from None
        if differ:
            listed = ", ".join(f"{k} {shown(a)} (plan: {shown(b)})" for k, (a, b) in sorted(differ.items()))
            raise ConfigError(f"{who}: {path} was made with {listed}; pin the values it was made with in the "
                              "study's base or the row's set (a default changed since?), or use another --out")


def _eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_children(commands: list[tuple[list[str], dict[str, str]]], jobs: int,
                 on_start=None, on_end=None) -> list[int]:
    """Run ``(argv, extra env)`` commands, at most ``jobs`` at a time, and return their exit codes in order.
    On Ctrl-C every running child gets the interrupt too and is waited for (each stops its own Ray cluster
    and keeps its finished rounds), then the interrupt goes on."""
    codes: list[int | None] = [None] * len(commands)
    running: dict[int, subprocess.Popen] = {}
    pending = list(range(len(commands)))
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i = pending.pop(0)
                argv, env = commands[i]
                if on_start:
                    on_start(i)
                running[i] = subprocess.Popen(argv, env={**os.environ, **env})
            for i, child in list(running.items()):
                if child.poll() is not None:
                    codes[i] = child.returncode
                    del running[i]
                    if on_end:
                        on_end(i, child.returncode)
            time.sleep(0.2)
    except KeyboardInterrupt as exc:
        # the signal the sweep got (Ctrl-C, or SIGTERM from kill, Slurm, docker), so that each run ends and
        # exits as the sweep does
        for child in running.values():
            child.send_signal(getattr(exc, "signum", signal.SIGINT))
        for child in running.values():
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        raise
    return [int(c) for c in codes]


def job_environments(jobs: int) -> list[dict[str, str]]:
    """Environment of each of ``jobs`` job slots: with CUDA GPUs, slot i sees only GPU i mod #GPUs
    (``CUDA_VISIBLE_DEVICES``); without, the runs share the CPUs."""
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA is the same as no GPU
        gpus = 0
    return [{"CUDA_VISIBLE_DEVICES": str(i % gpus)} if gpus else {} for i in range(jobs)]


def resumable(run_dir: str | Path) -> dict[str, Any]:
    """Keys that make a sweep run resumable within itself: the server checkpoint after every round and the
    clients' persistent state on disk (versioned by round, see ``fedpers.core.state_store``), both in the run's
    directory; an interrupted run continues after its last finished round when the sweep is started again."""
    run_dir = Path(run_dir)
    return {"checkpoint_dir": str(run_dir / "checkpoint"), "client_state_dir": str(run_dir / "client_state"),
            "resume": True}


def run_command(sweep: Sweep, run: PlannedRun, *, tensorboard: bool = False, engine: str = "ray") -> list[str]:
    """The ``fedpers run`` command line of one planned run. Every value is passed as JSON, read back as
    exactly this value: no character (a '#' in a path, a ': ', quotes) can change its meaning or its type.
    A key that the sweep's ``base`` gives every row goes with ``--shared``, the others with ``--set``: the
    run warns about another method's keys only when they were given for its own row. ``engine`` is the
    run's ``--engine`` (``ray`` or ``inprocess``)."""
    cmd = [sys.executable, "-m", "fedpers", "run"]
    for key, value in {**run.overrides, **resumable(run.run_dir), "tensorboard": tensorboard}.items():
        option = "--shared" if key in sweep.base and sweep.base[key] == value else "--set"
        cmd += [option, f"{key}={json.dumps(value)}"]
    return cmd if engine == "ray" else [*cmd, "--engine", engine]


def check_jobs(jobs: int) -> None:
    """``--jobs``, the number of runs at a time, is at least 1."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")


def run_sweep(sweep: Sweep, out: str | Path, *, tensorboard: bool = False, jobs: int = 1,
              engine: str = "ray") -> list[PlannedRun]:
    """Run every planned run that has no ``summary.json`` yet, each as its own ``fedpers run`` process
    (so a failing run cannot take the sweep down), ``jobs`` at a time (see :func:`job_environments`), each
    on ``engine``. Returns the runs that failed."""
    check_jobs(jobs)
    report_moves(move_legacy_run_dirs(sweep, out), out, "sweep")
    runs = plan(sweep, out)
    check_finished_runs(runs, "sweep")
    write_plan(sweep, out)
    todo = [r for r in runs if not (Path(r.run_dir) / "summary.json").exists()]
    print(f"sweep | {len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run -> {out}"
          + (f", {jobs} at a time" if jobs > 1 else ""), flush=True)
    slots = job_environments(jobs)
    commands = [(run_command(sweep, run, tensorboard=tensorboard, engine=engine), slots[i % jobs])
                for i, run in enumerate(todo)]
    started = time.perf_counter()
    finished = [0]

    def on_start(i: int) -> None:
        run = todo[i]
        elapsed = time.perf_counter() - started
        eta = elapsed / finished[0] * (len(todo) - finished[0]) / jobs if finished[0] else 0.0
        print(f"sweep | run {i + 1}/{len(todo)} | {run.run_key} {dataset_tag(run.dataset)} alpha={run.alpha:g} "
              f"seed={run.seed} | elapsed {_eta(elapsed)} | ETA {_eta(eta)}", flush=True)

    def on_end(i: int, code: int) -> None:
        finished[0] += 1
        if code != 0:
            print(f"sweep | run failed: {todo[i].run_dir}", flush=True)

    codes = run_children(commands, jobs, on_start, on_end)
    failed = [run for run, code in zip(todo, codes) if code != 0]
    print(f"sweep | finished in {_eta(time.perf_counter() - started)}; {len(failed)} failed", flush=True)
    return failed
