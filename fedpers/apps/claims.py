"""Claims as data: a study states its paper's claims, and ``fedpers report`` gives each a computed verdict.

A study (sweep) file may hold ``claims:``, a list of entries::

    claims:
      - id: ea-best                                   # short name, unique in the study
        paper: {quote: "For α = 0.05, it achieves the best mean accuracy", where: "Sec. 4.3, Table 2"}
        column: mnist_a0.05                           # <dataset>_a<alpha>; needed when the study has several
        value: final                                  # final (default) | best | last5 (mean of the last 5 evaluated)
        metric: personalized_weighted_acc             # optional: this metric for every row instead of each row's own
        order: [pFedKDH-EA, pFedKDH-Fair, FedPer]     # one form: each row above the next, or
        # delta: {a: FedEAGD, b: "w/o teacher", paper: 1.09}   # a - b, the paper's difference in points, or
        # within: {rows: [FedPer, FedAvg], tolerance: 1.5}     # each cell within tolerance of the paper's

Two rows are compared by the difference ``a - b`` in points over the seeds both finished, with one headline
95 % interval (Student's t, scipy) whose unit respects the design (:func:`compare`): from three seeds on the
seed is the unit (the interval of the seeds' own differences; a seed's clients are nested in its run);
with one or two seeds, where both rows read per-client accuracies of runs on the same split
(``personalized_macro_acc`` and its variants, from ``per_client_acc``, ``per_client_acc_fair``, ...; for
``final`` the last round's, ``last5`` the mean of each client over the last 5 evaluated rounds, ``best``
each run's best round), the clients of those runs are paired and the verdict says "one seed" / "two
seeds"; otherwise the seeds are paired. An ``order`` claim compares every row with every later one.

Every claim gets two answers. The **sign**: a comparison **holds** when the interval lies on the claimed
side of 0, **fails** when it lies on the other, and is **undecided** when it spans 0 or no interval exists
(one seed and no per-client values). The **size** (:func:`size_answer`): the paper's number (a ``delta``'s
difference; an ``order``'s difference of the study's ``paper:`` numbers where both rows have one; a
``within`` cell's value) inside our interval is "consistent", outside it "excluded: ours smaller / larger".
A ``within`` cell holds when the interval of its mean over seeds lies inside paper ± tolerance and fails
when it lies outside; with one seed the point decides. A claim one of whose rows has not run is **not
run**, never a failure. ``fedpers report`` judges each claim at its own ``value`` and also at ``final``
and ``last5`` (``other_readings``): the rule is the same for every study, declared in docs/running.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedpers.core.errors import ConfigError
from fedpers.core.results import read_metrics

FORMS = ("order", "delta", "within")
CLAIM_VALUES = ("final", "best", "last5")
SUMMARY_VALUE = {"final": "final", "best": "best", "last5": "mean_last_5_evaluated"}
CONFIDENCE = 0.95
LARGEST_SHOWN = 3  # per-client differences named under each paired comparison
# From this many seeds on the seed is the unit of every headline interval. Two give one degree of freedom, an
# interval about 13 times their spread, which says nothing the per-seed values do not; one gives none.
SEEDS_AS_UNIT = 3
SEED_WORDS = {1: "one seed", 2: "two seeds"}
PER_CLIENT_METRIC = "personalized_macro_acc"  # the metric whose per-client values per_client_acc holds


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, in a checkable form."""

    id: str
    form: str  # order | delta | within
    rows: list[str]  # order: in claimed order; delta: [a, b]; within: the rows checked
    quote: str = ""
    where: str = ""
    column: str = ""
    value: str = "final"
    metric: str | None = None
    paper: float | None = None  # delta: the paper's difference in points
    tolerance: float | None = None  # within: points
    extra: dict[str, Any] = field(default_factory=dict)


def parse_claims(raw: Any, labels: list[str], columns: list[str], paper: dict[str, dict[str, float]],
                 source: str) -> list[Claim]:
    """The study's ``claims:`` list, checked against its rows and columns; a bad entry is one clear line."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: 'claims' must be a list of claims")
    claims, seen = [], set()
    for i, item in enumerate(raw):
        where = f"{source}: claim {i + 1}"
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ConfigError(f"{where}: a claim is a mapping with a non-empty 'id'")
        where = f"{source}: claim '{item['id']}'"
        if item["id"] in seen:
            raise ConfigError(f"{where}: the id is used twice")
        seen.add(item["id"])
        unknown = set(item) - {"id", "paper", "column", "value", "metric", *FORMS}
        if unknown:
            raise ConfigError(f"{where}: unknown entries {sorted(unknown)}")
        forms = [f for f in FORMS if f in item]
        if len(forms) != 1:
            raise ConfigError(f"{where}: needs exactly one of {', '.join(FORMS)}")
        form = forms[0]
        words = item.get("paper") or {}
        if not isinstance(words, dict):
            raise ConfigError(f"{where}: 'paper' must be a mapping {{quote: ..., where: ...}}")
        column = str(item.get("column") or (columns[0] if len(columns) == 1 else ""))
        if column not in columns:
            raise ConfigError(f"{where}: 'column' must be one of {', '.join(columns)}, got {column or 'nothing'!r}")
        value = str(item.get("value", "final"))
        if value not in CLAIM_VALUES:
            raise ConfigError(f"{where}: 'value' must be one of {', '.join(CLAIM_VALUES)}, got {value!r}")
        body = item[form]
        paper_delta = tolerance = None
        if form == "order":
            if not isinstance(body, list) or len(body) < 2:
                raise ConfigError(f"{where}: 'order' lists two or more rows")
            rows = [str(r) for r in body]
        elif form == "delta":
            if not isinstance(body, dict) or not {"a", "b"} <= set(body):
                raise ConfigError(f"{where}: 'delta' is {{a: ROW, b: ROW, paper: POINTS}}")
            rows = [str(body["a"]), str(body["b"])]
            paper_delta = _number(body.get("paper"), f"{where}: delta 'paper'")
        else:
            if not isinstance(body, dict) or "tolerance" not in body:
                raise ConfigError(f"{where}: 'within' is {{rows: [ROW, ...] or all, tolerance: POINTS}}")
            tolerance = _number(body["tolerance"], f"{where}: within 'tolerance'")
            if tolerance < 0:
                raise ConfigError(f"{where}: within 'tolerance' must be 0 or more points, got {tolerance:g}")
            chosen = body.get("rows", "all")
            rows = list(labels) if chosen == "all" else [str(r) for r in (chosen if isinstance(chosen, list) else [chosen])]
            rows = [r for r in rows if chosen != "all" or column in paper.get(r, {})]
            if not rows:
                raise ConfigError(f"{where}: no row has a {column} number in the study's 'paper' table to be within")
            missing = [r for r in rows if column not in paper.get(r, {})]
            if missing:
                raise ConfigError(f"{where}: the study's 'paper' table has no {column} number for {', '.join(missing)}")
        if form in ("order", "delta") and len(set(rows)) != len(rows):
            twice = sorted({r for r in rows if rows.count(r) > 1})
            raise ConfigError(f"{where}: {', '.join(map(repr, twice))} is compared with itself (each row once)")
        unknown_rows = [r for r in rows if r not in labels]
        if unknown_rows:
            raise ConfigError(f"{where}: {', '.join(map(repr, unknown_rows))} is not a row of the study "
                              f"(rows: {', '.join(labels)})")
        claims.append(Claim(item["id"], form, rows, str(words.get("quote", "")), str(words.get("where", "")),
                            column, value, item.get("metric"), paper_delta, tolerance))
    return claims


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    return float(value)


# --- the numbers ---------------------------------------------------------------------------------------
@dataclass
class RowRun:
    """One finished run of a row: its value (%) and, where it has them, its per-client values (%)."""

    seed: int
    value: float
    per_client: dict[str, float] | None
    summary: dict[str, Any]


def row_runs(run_dirs: dict[int, str], metric: str | None, row_metric: str | None, value: str) -> dict[int, RowRun]:
    """Seed -> the finished run of a row (``run_dirs``: seed -> run directory), reading ``value`` of its metric
    (``metric`` for every row, else the row's, else the run's headline)."""
    out = {}
    for seed, run_dir in run_dirs.items():
        path = Path(run_dir) / "summary.json"
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        name = metric or row_metric or summary["metric"]
        recorded = summary.get("final") or {}
        if metric and recorded and metric not in recorded:
            raise ConfigError(f"claim metric {metric!r}: the finished run {run_dir} does not record it (it records "
                              f"{', '.join(sorted(recorded))})")
        chosen = summary.get(SUMMARY_VALUE[value], {}).get(name)
        if chosen is None:
            continue
        per_client = _per_client_values(run_dir, value, name) if name.startswith(PER_CLIENT_METRIC) else None
        out[seed] = RowRun(seed, 100.0 * float(chosen), per_client, summary)
    return out


def _per_client_values(run_dir: str, value: str, metric: str) -> dict[str, float] | None:
    """Each client's accuracy (%) behind the run's ``value`` of ``metric`` (personalized_macro_acc or one of
    its variants, personalized_macro_acc_fair, ...: per_client_acc, per_client_acc_fair, ...); None when the
    run did not record them (runs from before the variants' per-client values were recorded)."""
    key = metric.replace(PER_CLIENT_METRIC, "per_client_acc", 1)
    rounds = [r for r in read_metrics(run_dir) if r.get(key)]
    if not rounds:
        return None
    if value == "final":
        chosen = [rounds[-1]]
    elif value == "last5":
        chosen = rounds[-5:]
    else:  # the best round of the metric, the earliest on ties (as summary.json's best)
        best = max(rounds, key=lambda r: (r.get(metric) if r.get(metric) is not None else -1.0, -r["round"]))
        chosen = [best]
    clients = set.intersection(*[set(r[key]) for r in chosen])
    return {c: 100.0 * float(np.mean([r[key][c] for r in chosen])) for c in clients}


def _same_split(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("aux_size", "client_label_counts", "client_train_sizes")
    return all(a.get(k) == b.get(k) for k in keys)


def interval(samples: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95 % Student's t interval of the mean of ``samples`` (None for fewer than two)."""
    if len(samples) < 2:
        return None
    x = np.asarray(samples, dtype=float)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(CONFIDENCE, len(x) - 1, loc=mean, scale=sd / math.sqrt(len(x)))
    return mean, float(low), float(high)


def compare(a: dict[int, RowRun], b: dict[int, RowRun]) -> dict[str, Any]:
    """``a - b`` in points over the seeds both rows finished: each seed's difference of the two values, their
    mean, and one headline 95 % interval whose unit respects the design (clients are nested in seeds: a
    seed's clients share its split, initial model and batch order).

    * From :data:`SEEDS_AS_UNIT` seeds on, the seed is the unit: the Student's t interval of the seeds' own
      differences (``paired = "seeds"``). A seed's difference of personalized macro accuracies is the mean
      of its clients' differences, so with the same clients in every seed this is the interval of the
      fixed effect in a random-intercept model of the client differences with the seed as the random
      effect (balanced nested design); ``pooled_clients`` keeps the client pairs pooled over seeds beside
      it, for reading only (it treats the runs' shared noise as independent and is too narrow).
    * Below that, where both rows have per-client values on the same split, the clients of the one or two
      runs are paired (``paired = "clients"``): an interval of within-run noise only, which the verdict
      labels "one seed" / "two seeds". Without per-client values, the seeds are paired (two give an
      interval, one none)."""
    seeds = sorted(set(a) & set(b))
    result: dict[str, Any] = {"seeds": seeds, "n": len(seeds)}
    if not seeds:
        return result
    result["per_seed"] = {s: a[s].value - b[s].value for s in seeds}
    seed_diffs = list(result["per_seed"].values())
    result["diff"] = float(np.mean(seed_diffs))
    per_client = all(a[s].per_client and b[s].per_client and _same_split(a[s].summary, b[s].summary) for s in seeds)
    pooled = None
    if per_client:
        keyed = [(s, c, a[s].per_client[c] - b[s].per_client[c]) for s in seeds
                 for c in sorted(set(a[s].per_client) & set(b[s].per_client), key=_client_order)]
        diffs = [d for _, _, d in keyed]
        result.update(client_pairs=len(diffs), higher=int(sum(d > 1e-9 for d in diffs)),
                      lower=int(sum(d < -1e-9 for d in diffs)))
        # which clients carry the mean: a client of 4 test samples moves by 25 points per sample
        ranked = sorted(keyed, key=lambda k: (-abs(k[2]), k[0], _client_order(k[1])))
        result["largest"] = [{"seed": s, "client": c, "diff": d, "test_samples": _test_samples(a[s].summary, c)}
                             for s, c, d in ranked[:LARGEST_SHOWN]]
        if len(diffs) > 1:
            result["mean_without_largest"] = float(np.mean([d for _, _, d in ranked[1:]]))
        pooled = interval(diffs)
    if len(seeds) >= SEEDS_AS_UNIT:
        result.update(paired="seeds", pairs=len(seeds))
        found = interval(seed_diffs)
        if pooled is not None:
            result["pooled_clients"] = {"low": pooled[1], "high": pooled[2]}
    elif per_client:
        result.update(paired="clients", pairs=result["client_pairs"])
        found = pooled
    else:
        result.update(paired="seeds", pairs=len(seeds))
        found = interval(seed_diffs)
    if found is not None:
        result["mean"], result["low"], result["high"] = found
    return result


def size_answer(low: float | None, high: float | None, paper: float | None, direction: float = 1.0) -> str | None:
    """Whether the paper's number lies in our 95 % interval: ``consistent``, or ``excluded: ours smaller`` /
    ``excluded: ours larger`` (None: no paper number or no interval). ``direction`` -1 reads a difference
    the paper claims negative in its own direction: ours "smaller" is then closer to 0 than the paper's."""
    if paper is None or low is None or high is None:
        return None
    if low <= paper <= high:
        return "consistent"
    below = paper > high if direction >= 0 else paper < low
    return "excluded: ours smaller" if below else "excluded: ours larger"


def _joint_size(sizes: list[tuple[str, str | None]]) -> str | None:
    """One size answer for a claim of several comparisons or cells (``(what, answer)`` pairs): the common
    answer, else each excluded one named."""
    given = [(what, s) for what, s in sizes if s is not None]
    if not given:
        return None
    answers = {s for _, s in given}
    if len(answers) == 1 and len(given) == len(sizes):
        return given[0][1]
    excluded = [f"{what}: {s.removeprefix('excluded: ')}" for what, s in given if s.startswith("excluded")]
    if not excluded:
        return "consistent where a paper number exists"
    return "excluded (" + "; ".join(excluded) + ")"


def _client_order(client: str) -> tuple[int, str]:
    return (int(client), "") if client.isdigit() else (10**9, client)


def _test_samples(summary: dict[str, Any], client: str) -> int | None:
    """The client's test-split size, from the run's ``client_label_counts`` (None if not recorded)."""
    counts = summary.get("client_label_counts", {}).get(client, {}).get("test")
    return int(sum(counts)) if counts is not None else None


def side_of_zero(comparison: dict[str, Any]) -> str:
    """holds (interval above 0), fails (below 0) or undecided (spans 0, or no interval)."""
    if "low" not in comparison:
        return "undecided"
    if comparison["low"] > 0:
        return "holds"
    if comparison["high"] < 0:
        return "fails"
    return "undecided"


def _sample_sd(values: list[float]) -> float | None:
    """The sample standard deviation (ddof 1) of two or more values; None for one."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def judge(claim: Claim, rows: dict[str, dict[int, RowRun]], paper: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The verdict of one claim at its ``value`` (``rows``: label -> seed -> finished run), with the numbers
    behind it: the sign (holds / fails / undecided on the headline interval of :func:`compare`) and the
    size (:func:`size_answer`: the paper's number inside our interval or not)."""
    out: dict[str, Any] = {"id": claim.id, "form": claim.form, "rows": claim.rows, "column": claim.column,
                           "value": claim.value, "metric": claim.metric, "quote": claim.quote, "where": claim.where,
                           "tolerance": claim.tolerance, "cells": {}, "size": None}
    # a difference pairs the rows on the seeds both finished; cells over each row's own seeds would set a
    # mean of seeds 0-2 beside a mean of seed 0 (different splits), so a comparison's cells share its seeds
    finished = {label: set(rows.get(label, {})) for label in claim.rows}
    common = set.intersection(*finished.values()) if finished else set()
    paired_cells = claim.form in ("order", "delta") and bool(common)
    out["cell_seeds"] = sorted(common) if paired_cells else None
    for label in claim.rows:
        kept = {s: r for s, r in rows.get(label, {}).items() if not paired_cells or s in common}
        values = [kept[s].value for s in sorted(kept)]
        out["cells"][label] = {"n": len(values), "finished": len(finished[label]),
                               "paper": paper.get(label, {}).get(claim.column),
                               "mean": float(np.mean(values)) if values else None, "sd": _sample_sd(values)}
        # runs trained on a GPU, named wherever their numbers are used (their arithmetic differs from the
        # CPU's in the last digits)
        gpu = sorted(s for s, r in kept.items() if str(r.summary.get("config", {}).get("device", "")).startswith("cuda"))
        if gpu:
            out["cells"][label]["gpu_seeds"] = gpu
    not_run = [label for label in claim.rows if not finished[label]]
    n = min(cell["n"] for cell in out["cells"].values())
    out["n"] = n
    why_not_run = f"no finished run of {', '.join(not_run)}"
    if not_run and claim.form != "within":
        out.update(verdict="not run", why=why_not_run)
        return out
    if claim.form in ("order", "delta"):
        # order: every row above every later one (not only the next: a chain of undecided steps can hide a
        # clear gap between its ends)
        pairs = [(a, b) for i, a in enumerate(claim.rows) for b in claim.rows[i + 1:]]
        out["comparisons"] = [{"a": a, "b": b, **compare(rows[a], rows[b])} for a, b in pairs]
        unpaired = [f"{c['a']} and {c['b']}" for c in out["comparisons"] if not c["n"]]
        if unpaired:  # each row finished, but not at a common seed: nothing to compare yet
            out.update(n=0, verdict="not run", why=f"no seed that both {'; '.join(unpaired)} finished")
            return out
        verdicts = _on_the_claimed_side([side_of_zero(c) for c in out["comparisons"]], claim.form, claim.paper)
        sizes = []
        for c, v in zip(out["comparisons"], verdicts):
            c["verdict"] = v
            if claim.form == "delta":
                c["paper_diff"] = claim.paper
            else:  # the paper's own difference where its table has both rows
                pa, pb = paper.get(c["a"], {}).get(claim.column), paper.get(c["b"], {}).get(claim.column)
                c["paper_diff"] = None if pa is None or pb is None else pa - pb
            direction = -1.0 if (c["paper_diff"] or 0.0) < 0 else 1.0
            c["size"] = size_answer(c.get("low"), c.get("high"), c["paper_diff"], direction)
            sizes.append((f"{c['a']} − {c['b']}", c["size"]))
        out["size"] = _joint_size(sizes)
        if claim.form == "delta":
            out["paper_delta"] = claim.paper
        # a difference rests on the seeds both rows finished, which may be fewer than each row's own
        # (a row given more seeds than the row it is compared with)
        n = min(c["n"] for c in out["comparisons"])
        out["n"] = n
        out["verdict"] = _joint_verdict(verdicts)
    else:
        # each cell that has run is judged: one outside the tolerance fails the claim before the rest run
        tol = float(claim.tolerance or 0.0)
        verdicts, sizes = [], []
        for label in claim.rows:
            if label in not_run:
                continue
            cell = out["cells"][label]
            values = [r.value for r in rows[label].values()]
            lo_ok, hi_ok = cell["paper"] - tol, cell["paper"] + tol
            found = interval(values)
            low, high = (found[1], found[2]) if found else (cell["mean"], cell["mean"])
            cell["low"], cell["high"] = (found[1], found[2]) if found else (None, None)
            v = ("holds" if lo_ok <= low and high <= hi_ok else
                 "fails" if high < lo_ok or low > hi_ok else "undecided")
            cell["verdict"] = v
            cell["size"] = size_answer(cell["low"], cell["high"], cell["paper"])
            verdicts.append(v)
            sizes.append((label, cell["size"]))
        out["size"] = _joint_size(sizes)
        out["verdict"] = ("fails" if "fails" in verdicts else "not run" if not_run else
                          "holds" if all(v == "holds" for v in verdicts) else "undecided")
        if not_run:
            out["why"] = why_not_run if out["verdict"] == "not run" else f"decided by the cells that ran; {why_not_run}"
            n = min(cell["n"] for label, cell in out["cells"].items() if label not in not_run) if verdicts else 0
            out["n"] = n
    if n in SEED_WORDS:
        out["seed_note"] = SEED_WORDS[n]
    return out


def readings_of(claim: Claim) -> list[str]:
    """The values a claim is judged at: its own first (the headline), then the final round and the mean of
    the last 5 evaluated rounds where it is not one of them (the papers report the final or the best round;
    the last 5 say whether one round's value is stable)."""
    return [claim.value] + [v for v in ("final", "last5") if v != claim.value]


def _on_the_claimed_side(verdicts: list[str], form: str, paper_delta: float | None) -> list[str]:
    """Side-of-zero verdicts turned round where a ``delta`` claim's paper has a below b."""
    if form == "delta" and paper_delta is not None and paper_delta < 0:
        return [{"holds": "fails", "fails": "holds"}.get(v, v) for v in verdicts]
    return verdicts


def _joint_verdict(verdicts: list[str]) -> str:
    """A claim of several comparisons fails if one fails and holds only if all hold."""
    return "fails" if "fails" in verdicts else "holds" if all(v == "holds" for v in verdicts) else "undecided"


# --- the files ---------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _ours(cell: dict[str, Any]) -> str:
    if not cell["n"]:
        return "not run"
    gpu = cell.get("gpu_seeds")
    return (f"{cell['mean']:.2f}" + (f" ± {cell['sd']:.2f}" if cell.get("sd") is not None else "")
            + (f" (GPU: seed{'s' if len(gpu) > 1 else ''} {', '.join(map(str, gpu))})" if gpu else ""))


def _span(c: dict[str, Any]) -> str:
    return f"95 % {c['low']:+.2f} to {c['high']:+.2f}" if c.get("low") is not None else "no interval"


def _comparison_lines(c: dict[str, Any]) -> list[str]:
    """A comparison's lines in claims.md: the difference, its headline interval and unit, the verdict and the
    paper's size; then each seed's difference, the pooled client pairs and the clients that carry it."""
    of_seeds = f" of seed{'s' if len(c['seeds']) > 1 else ''} {', '.join(map(str, c['seeds']))}"
    if c.get("paired") == "clients":
        how = f"over {c['pairs']} client pairs{of_seeds} ({c['higher']} higher, {c['lower']} lower)"
    elif c.get("pairs", 0) >= SEEDS_AS_UNIT:
        how = f"over {c['pairs']} seeds, the seed the unit"
    elif c.get("pairs", 0) > 1:
        how = f"over {c['pairs']} seeds"
    else:
        how = "one seed and no per-client values to pair"
    size = f"; the paper's {c['paper_diff']:+.2f}: {c['size'] or 'no interval'}" if c.get("paper_diff") is not None else ""
    lines = [f"- {c['a']} − {c['b']}: {c['diff']:+.2f} points; {_span(c)} {how}: **{c['verdict']}**{size}"]
    if len(c.get("per_seed", {})) > 1:
        lines.append("  - per seed: " + ", ".join(f"{d:+.2f} (seed {s})" for s, d in c["per_seed"].items()))
    if "pooled_clients" in c:
        p = c["pooled_clients"]
        lines.append(f"  - the {c['client_pairs']} client pairs pooled over the seeds ({c['higher']} higher, "
                     f"{c['lower']} lower): 95 % {p['low']:+.2f} to {p['high']:+.2f}, for reading only (a seed's "
                     "clients share its run, so they are not independent)")
    if c.get("largest"):
        shown = "; ".join(f"seed {x['seed']} client {x['client']}"
                          + (f" ({x['test_samples']} test samples)" if x["test_samples"] is not None else "")
                          + f" {x['diff']:+.2f}" for x in c["largest"])
        without = (f"; the mean without the first: {c['mean_without_largest']:+.2f}"
                   if "mean_without_largest" in c else "")
        lines.append(f"  - largest per-client differences: {shown}{without}")
    return lines


def _reading_line(r: dict[str, Any]) -> str:
    """One other reading of a claim in a line: its verdict and size, and each comparison's difference."""
    parts = [f"{c['a']} − {c['b']} {c['diff']:+.2f} ({_span(c)})" for c in r.get("comparisons", []) if "diff" in c]
    parts += [f"{label} {_ours(cell)}" + (f" ({cell['low']:.2f} to {cell['high']:.2f})" if cell.get("low") is not None else "")
              for label, cell in r["cells"].items() if r["form"] == "within" and cell["n"]]
    return f"- {r['value']}: **{verdict_words(r)}**" + (f"; {'; '.join(parts)}" if parts else "")


def claims_markdown(results: list[dict[str, Any]], study: str) -> str:
    """``claims.md``: per claim the paper's words and numbers, ours (mean ± sample SD over seeds, n), the
    differences with their headline 95 % intervals, the verdict on the sign and on the paper's size, at the
    claim's own reading and at the final round and the last 5 evaluated rounds."""
    lines = [f"# Claims of {study}", "",
             "Generated by `fedpers report` from the study's `claims:` and its finished runs, by the rule in "
             "docs/running.md (\"Claims and verdicts\"). Values in %, mean ± sample SD (ddof 1) over seeds, with "
             "n. Differences a − b in points with one 95 % Student's t interval each: from three seeds on over "
             "the seeds' own differences (the seed is the unit; a seed's clients are nested in its run); with "
             "one or two seeds over the clients of those runs, paired on the same split (within-run noise only: "
             "\"one seed\" / \"two seeds\"), else over the seeds. Two answers per claim: the **sign** (holds: the "
             "interval lies on the claimed side; fails: on the other; undecided: it spans the line, or there is "
             "no interval) and the **size** (the paper's number inside our interval: consistent; outside: "
             "excluded, ours smaller or larger). Each claim at its own reading first, then at the final round "
             "and the mean of the last 5 evaluated rounds.", "",
             "| claim | reading | sign | paper's size | n (seeds) | other readings |", "|---|---|---|---|---|---|"]
    for r in results:
        others = "; ".join(f"{o['value']}: {verdict_words(o)}" for o in r.get("other_readings", []))
        lines.append(f"| [{r['id']}](#{r['id']}) | {r['value']} | {verdict_words(r)} | {r.get('size') or '–'} | "
                     f"{r['n']} | {others or '–'} |")
    for r in results:
        lines += ["", f"## {r['id']}", ""]
        if r["quote"]:
            lines.append(f"> {r['quote']}" + (f" ({r['where']})" if r["where"] else ""))
            lines.append("")
        what = (" > ".join(r["rows"]) if r["form"] == "order" else
                f"{r['rows'][0]} − {r['rows'][1]}" if r["form"] == "delta" else
                f"each of {', '.join(r['rows'])} within ±{r['tolerance']:g} of the paper")
        lines.append(f"Form: {r['form']}: {what}; column {r['column']}; value {r['value']}"
                     + (f"; metric {r['metric']}" if r["metric"] else "") + ".")
        within = r["form"] == "within"
        lines += ["", "| row | paper | ours | n |" + (" verdict | paper's size |" if within else ""),
                  "|---|---|---|---|" + ("---|---|" if within else "")]
        for label, cell in r["cells"].items():
            extra = ""
            if within:
                span = "" if cell.get("low") is None else f" (95 %: {cell['low']:.2f} to {cell['high']:.2f})"
                extra = f" {cell.get('verdict', '–')}{span} | {cell.get('size') or '–'} |"
            n = cell["n"] if cell["finished"] == cell["n"] else f"{cell['n']} (of {cell['finished']} finished)"
            lines.append(f"| {label} | {_pct(cell['paper'])} | {_ours(cell)} | {n} |{extra}")
        if r["cell_seeds"] is not None and any(c["n"] != c["finished"] for c in r["cells"].values()):
            seeds = r["cell_seeds"]
            plural = "s" if len(seeds) > 1 else ""
            lines += ["", f"Cells at seed{plural} {', '.join(map(str, seeds))}: the seed{plural} that every row of "
                          "the claim finished (each difference names the seeds it pairs); a row's other seeds are "
                          "in `table.md`."]
        for c in r.get("comparisons", []) if r["verdict"] != "not run" else []:
            lines += [""] + _comparison_lines(c)
        lines += ["", f"**Verdict ({r['value']}): {verdict_words(r)}**" + (f" ({r['why']})" if r.get("why") else "")
                  + (f"; the paper's size: {r['size']}" if r.get("size") else "")]
        if r.get("other_readings"):
            lines += ["", "Other readings:"] + [_reading_line(o) for o in r["other_readings"]]
    return "\n".join(lines) + "\n"


def verdict_words(r: dict[str, Any]) -> str:
    """A judged claim's verdict as claims.md and the results pages print it: the sign, and "one seed" /
    "two seeds" where fewer than three seeds decide it."""
    return r["verdict"] + (f", {r['seed_note']}" if r.get("seed_note") and r["verdict"] != "not run" else "")


def write_claims(results: list[dict[str, Any]], out: Path, study: str) -> list[Path]:
    """``claims.md`` and ``claims.json`` in ``out``."""
    (out / "claims.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "claims.md").write_text(claims_markdown(results, study))
    return [out / "claims.md", out / "claims.json"]


# --- one claim over several studies ----------------------------------------------------------------------
def pooled_comparison(per_study: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One difference ``a - b`` pooled over studies that ran the same rows in different settings (``per_study``:
    study -> seed -> that seed's difference in points, as :func:`compare` records it): every (study, seed)
    a unit, their mean and, from :data:`SEEDS_AS_UNIT` units on, the 95 % Student's t interval over them
    (:func:`interval`) and its side of zero (:func:`side_of_zero`). The units' spread holds the settings'
    spread as well as the seeds', so this is the interval of the mean effect over these settings (each
    weighted by its seeds), wider than one setting's own when the settings differ; each study's own mean
    and n are kept beside it."""
    units = {f"{study}/{seed}": float(d) for study, diffs in per_study.items() for seed, d in diffs.items()}
    out: dict[str, Any] = {"n": len(units), "units": units,
                           "per_study": {study: {"n": len(diffs), "mean": float(np.mean(list(diffs.values())))}
                                         for study, diffs in per_study.items() if diffs}}
    if units:
        out["diff"] = float(np.mean(list(units.values())))
        out["sd"] = _sample_sd(list(units.values()))
    found = interval(list(units.values())) if len(units) >= SEEDS_AS_UNIT else None
    if found is not None:
        out["mean"], out["low"], out["high"] = found
    out["verdict"] = side_of_zero(out)
    return out


def pool_claims(studies: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Each claim that every study judged alike (same id, form, rows and paper difference; ``studies``: study -> its
    ``claims.json``), pooled over the studies at each reading (:func:`pooled_comparison` per comparison, one
    verdict per reading as in :func:`judge`). Returns the pooled claims and, for each claim left out, the
    studies that hold it (a claim of some settings only, such as another optimizer's)."""
    readings = {study: {r["id"]: {o["value"]: o for o in [r, *r.get("other_readings", [])]} for r in results}
                for study, results in studies.items()}
    ids = list(dict.fromkeys(r["id"] for results in studies.values() for r in results))
    pooled, left_out = [], {}
    for cid in ids:
        holders = [s for s in studies if cid in readings[s]]
        headlines = [next(iter(readings[s][cid].values())) for s in holders]
        shapes = {(h["form"], tuple(h["rows"]), h.get("paper_delta")) for h in headlines}
        # a within claim has a paper number per cell, not a difference to pool
        if len(holders) < len(studies) or len(shapes) != 1 or headlines[0]["form"] == "within":
            left_out[cid] = holders
            continue
        first = readings[holders[0]][cid]
        entry: dict[str, Any] = {"id": cid, "form": headlines[0]["form"], "rows": list(headlines[0]["rows"]),
                                 "studies": holders, "quote": headlines[0]["quote"], "readings": []}
        form = entry["form"]
        for value in first:
            if not all(value in readings[s][cid] for s in holders):
                continue
            if not all(readings[s][cid][value].get("comparisons") for s in holders):  # not run in some study
                entry["readings"].append({"value": value, "comparisons": [], "verdict": "not run", "n": 0})
                continue
            comparisons = []
            for i, c in enumerate(first[value]["comparisons"]):
                per_study = {s: readings[s][cid][value]["comparisons"][i].get("per_seed", {}) for s in holders}
                comparisons.append({"a": c["a"], "b": c["b"], **pooled_comparison(per_study)})
            verdicts = _on_the_claimed_side([c["verdict"] for c in comparisons], form,
                                            first[value].get("paper_delta"))
            entry["readings"].append({"value": value, "comparisons": comparisons,
                                      "verdict": _joint_verdict(verdicts), "n": min(c["n"] for c in comparisons)})
        pooled.append(entry)
    return pooled, left_out


def pooled_markdown(pooled: list[dict[str, Any]], left_out: dict[str, list[str]], title: str) -> str:
    """The pooled claims as Markdown: per claim and reading, each study's mean difference (n), the pooled
    difference over every (study, seed), its 95 % interval and the verdict."""
    studies = list(dict.fromkeys(s for p in pooled for s in p["studies"]))
    lines = [f"# {title}", "",
             "Generated by `benchmarks/claims_pooled.py` from the studies' own `claims.json` "
             f"({', '.join(studies)}). Each claim the studies share, pooled: every (study, seed) difference "
             "a − b in points is a unit; the pooled difference is their mean, with one 95 % Student's t interval "
             "over them (from three units on). Its spread holds the settings' spread as well as the seeds', so "
             "it is the interval of the mean effect over these settings (each weighted by its seeds), not of any "
             "one of them. Verdicts as in each study's claims.md: holds (the interval on the claimed side), "
             "fails (on the other), undecided (spans 0). No paper numbers: the size is not judged here.", ""]
    for p in pooled:
        lines += [f"## {p['id']}", ""]
        if p["quote"]:
            lines += [f"> {p['quote']}", ""]
        lines += [f"Form: {p['form']}: {' > '.join(p['rows']) if p['form'] == 'order' else ' − '.join(p['rows'])}.",
                  "", "| reading | difference | " + " | ".join(p["studies"]) + " | pooled | 95 % | n | verdict |",
                  "|---|---|" + "---|" * len(p["studies"]) + "---|---|---|---|"]
        for r in p["readings"]:
            if not r["comparisons"]:
                lines.append(f"| {r['value']} | not run in every study | " + " | ".join("–" for _ in p["studies"])
                             + " | – | – | 0 | **not run** |")
            for c in r["comparisons"]:
                cells = [f"{c['per_study'][s]['mean']:+.2f} ({c['per_study'][s]['n']})" if s in c["per_study"]
                         else "–" for s in p["studies"]]
                span = f"{c['low']:+.2f} to {c['high']:+.2f}" if "low" in c else "no interval"
                diff = f"{c['diff']:+.2f}" if "diff" in c else "–"
                lines.append(f"| {r['value']} | {c['a']} − {c['b']} | " + " | ".join(cells)
                             + f" | {diff} | {span} | {c['n']} | **{c['verdict']}** |")
        lines.append("")
    if left_out:
        lines += ["Not pooled (a claim not every study judged alike, or a within claim): "
                  + "; ".join(f"{cid} ({', '.join(h) or 'none'})" for cid, h in left_out.items()) + ".", ""]
    return "\n".join(lines)
