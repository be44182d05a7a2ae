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

Two rows are compared by the difference ``a - b`` in points with a 95 % interval (Student's t, scipy):
paired per client, pooled over the seeds and clients, where both rows read per-client accuracies of runs on
the same split (``personalized_macro_acc`` and its variants, from ``per_client_acc``, ``per_client_acc_fair``,
...; for ``final`` the last round's, ``last5`` the mean of each client over the last 5 evaluated rounds,
``best`` each run's best round); otherwise paired over the seeds both rows finished (needs two or more). An
``order`` claim compares every row with every later one. A comparison **holds** when the interval lies above 0, **fails**
when it lies below, and is **undecided** when it spans 0 or no interval exists (one seed and no per-client
values). From three seeds on, a per-client pairing also reports the interval of the seeds' own
differences and its verdict (a seed's clients share its run, so they are not independent across runs);
a claim says where that verdict differs. A ``within`` cell holds when the interval of its mean over seeds
lies inside paper ± tolerance and fails when it lies outside; with one seed the point decides and the
verdict says "one seed". A claim one of whose rows has not run is **not run**, never a failure.
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
# fewest seeds whose own differences get an interval beside a per-client pairing: two give one degree of
# freedom, an interval about 13 times their spread, which says nothing the per-seed values do not
SEEDS_FOR_OWN_INTERVAL = 3
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
            chosen = body.get("rows", "all")
            rows = list(labels) if chosen == "all" else [str(r) for r in (chosen if isinstance(chosen, list) else [chosen])]
            rows = [r for r in rows if chosen != "all" or column in paper.get(r, {})]
            missing = [r for r in rows if column not in paper.get(r, {})]
            if missing:
                raise ConfigError(f"{where}: the study's 'paper' table has no {column} number for {', '.join(missing)}")
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
    """``a - b`` in points: over the seeds both rows finished, the mean difference of their values, and the
    95 % interval, paired per client (pooled over seeds and clients) where every seed's two runs share a
    split and have per-client values, else paired over seeds. Beside a pooled interval of three or more
    seeds, ``over_seeds`` is the interval of the seeds' own differences."""
    seeds = sorted(set(a) & set(b))
    result: dict[str, Any] = {"seeds": seeds, "n": len(seeds)}
    if not seeds:
        return result
    # each seed's own difference beside the pooled interval: pooling per-client pairs over seeds does not
    # show whether the seeds agree, which their spread does
    result["per_seed"] = {s: a[s].value - b[s].value for s in seeds}
    seed_diffs = list(result["per_seed"].values())
    result["diff"] = float(np.mean(seed_diffs))
    per_client = all(a[s].per_client and b[s].per_client and _same_split(a[s].summary, b[s].summary) for s in seeds)
    if per_client:
        keyed = [(s, c, a[s].per_client[c] - b[s].per_client[c]) for s in seeds
                 for c in sorted(set(a[s].per_client) & set(b[s].per_client), key=_client_order)]
        diffs = [d for _, _, d in keyed]
        result.update(paired="clients", pairs=len(diffs), higher=int(sum(d > 1e-9 for d in diffs)),
                      lower=int(sum(d < -1e-9 for d in diffs)))
        # which clients carry the mean: a client of 4 test samples moves by 25 points per sample
        ranked = sorted(keyed, key=lambda k: (-abs(k[2]), k[0], _client_order(k[1])))
        result["largest"] = [{"seed": s, "client": c, "diff": d, "test_samples": _test_samples(a[s].summary, c)}
                             for s, c, d in ranked[:LARGEST_SHOWN]]
        if len(diffs) > 1:
            result["mean_without_largest"] = float(np.mean([d for _, _, d in ranked[1:]]))
        found = interval(diffs)
        # a seed's clients share its run (split, initial model, batch order), so the pooled pairs are not
        # independent across runs; from three seeds on, the interval of the seeds' own differences (n - 1
        # degrees of freedom) shows whether the seeds agree beyond that shared noise
        if len(seeds) >= SEEDS_FOR_OWN_INTERVAL:
            _, low, high = interval(seed_diffs)
            result["over_seeds"] = {"low": low, "high": high}
    else:
        result.update(paired="seeds", pairs=len(seeds))
        found = interval(seed_diffs)
    if found is not None:
        result["mean"], result["low"], result["high"] = found
    return result


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


def judge(claim: Claim, rows: dict[str, dict[int, RowRun]], paper: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The verdict of one claim with the numbers behind it (``rows``: label -> seed -> finished run)."""
    out: dict[str, Any] = {"id": claim.id, "form": claim.form, "rows": claim.rows, "column": claim.column,
                           "value": claim.value, "metric": claim.metric, "quote": claim.quote, "where": claim.where,
                           "tolerance": claim.tolerance, "cells": {}}
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
                               "mean": float(np.mean(values)) if values else None,
                               "std": float(np.std(values)) if values else None}
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
        verdicts = [side_of_zero(c) for c in out["comparisons"]]
        if claim.form == "delta":
            out["paper_delta"] = claim.paper
            verdicts = _on_the_claimed_side(verdicts, claim)
            c = out["comparisons"][0]
            if "low" in c and claim.paper is not None:
                out["paper_delta_inside"] = bool(c["low"] <= claim.paper <= c["high"])
        for c, v in zip(out["comparisons"], verdicts):
            c["verdict"] = v
        # the same verdict from the seeds' own differences, where every comparison has them: where it
        # differs, the pooled client pairs decide what the runs alone do not, or the other way round
        with_seeds = [c for c in out["comparisons"] if "over_seeds" in c]
        alone = _on_the_claimed_side([side_of_zero(c["over_seeds"]) for c in with_seeds], claim)
        for c, v in zip(with_seeds, alone):
            c["over_seeds"]["verdict"] = v
        if with_seeds and len(with_seeds) == len(out["comparisons"]):
            out["seeds_alone"] = _joint_verdict(alone)
        # a difference rests on the seeds both rows finished, which may be fewer than each row's own
        # (a row given more seeds than the row it is compared with)
        n = min(c["n"] for c in out["comparisons"])
        out["n"] = n
        out["verdict"] = _joint_verdict(verdicts)
    else:
        # each cell that has run is judged: one outside the tolerance fails the claim before the rest run
        tol = float(claim.tolerance or 0.0)
        verdicts = []
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
            verdicts.append(v)
        out["verdict"] = ("fails" if "fails" in verdicts else "not run" if not_run else
                          "holds" if all(v == "holds" for v in verdicts) else "undecided")
        if not_run:
            out["why"] = why_not_run if out["verdict"] == "not run" else f"decided by the cells that ran; {why_not_run}"
            n = min(cell["n"] for label, cell in out["cells"].items() if label not in not_run) if verdicts else 0
            out["n"] = n
    if n == 1:
        out["one_seed"] = True
    return out


def _on_the_claimed_side(verdicts: list[str], claim: Claim) -> list[str]:
    """Side-of-zero verdicts turned round where a ``delta`` claim's paper has a below b."""
    if claim.form == "delta" and claim.paper is not None and claim.paper < 0:
        return [{"holds": "fails", "fails": "holds"}.get(v, v) for v in verdicts]
    return verdicts


def _joint_verdict(verdicts: list[str]) -> str:
    """A claim of several comparisons fails if one fails and holds only if all hold."""
    return "fails" if "fails" in verdicts else "holds" if all(v == "holds" for v in verdicts) else "undecided"


# --- the files ---------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def claims_markdown(results: list[dict[str, Any]], study: str) -> str:
    """``claims.md``: per claim the paper's words and numbers, ours (mean ± std over seeds, n), the paired
    differences with their 95 % intervals, and the verdict."""
    lines = [f"# Claims of {study}", "",
             "Generated by `fedpers report` from the study's `claims:` and its finished runs. Values in %, "
             "mean ± std over seeds (n). Differences a − b in points with a 95 % Student's t interval: "
             "paired per client pooled over seeds and clients where both rows have per-client values on the "
             "same split, else paired over seeds; from three seeds on, a per-client pairing also gives the "
             "interval of the seeds' own differences, since a seed's clients share its run. **holds**: the "
             "interval lies on the claimed side; **fails**: on the other; **undecided**: it spans the line, or "
             "there is no interval.", "",
             "| claim | verdict | n (seeds) |", "|---|---|---|"]
    for r in results:
        lines.append(f"| [{r['id']}](#{r['id']}) | {_verdict_words(r)} | {r['n']} |")
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
        lines += ["", "| row | paper | ours | n |" + (" verdict |" if r["form"] == "within" else ""),
                  "|---|---|---|---|" + ("---|" if r["form"] == "within" else "")]
        for label, cell in r["cells"].items():
            ours = "not run" if not cell["n"] else f"{cell['mean']:.2f} ± {cell['std']:.2f}"
            extra = ""
            if r["form"] == "within":
                span = "" if cell.get("low") is None else f" (95 %: {cell['low']:.2f} to {cell['high']:.2f})"
                extra = f" {cell.get('verdict', '–')}{span} |"
            n = cell["n"] if cell["finished"] == cell["n"] else f"{cell['n']} (of {cell['finished']} finished)"
            lines.append(f"| {label} | {_pct(cell['paper'])} | {ours} | {n} |{extra}")
        if r["cell_seeds"] is not None and any(c["n"] != c["finished"] for c in r["cells"].values()):
            seeds = r["cell_seeds"]
            plural = "s" if len(seeds) > 1 else ""
            lines += ["", f"Cells at seed{plural} {', '.join(map(str, seeds))}: the seed{plural} that every row of "
                          "the claim finished (each difference names the seeds it pairs); a row's other seeds are "
                          "in `table.md`."]
        for c in r.get("comparisons", []) if r["verdict"] != "not run" else []:
            span = (f"95 % {c['low']:+.2f} to {c['high']:+.2f}" if "low" in c else "no interval")
            of_seeds = f" of seed{'s' if len(c['seeds']) > 1 else ''} {', '.join(map(str, c['seeds']))}"
            how = (f"paired over {c['pairs']} client pairs{of_seeds} ({c['higher']} higher, {c['lower']} lower)"
                   if c.get("paired") == "clients" else f"paired over {c.get('pairs', 0)} seeds" if c.get("pairs", 0) > 1
                   else "one seed and no per-client values to pair")
            lines.append("")
            lines.append(f"- {c['a']} − {c['b']}: {c['diff']:+.2f} points; {span}; {how}: **{c['verdict']}**")
            if len(c.get("per_seed", {})) > 1:
                seeds_alone = c.get("over_seeds")
                over = (f"; over the {len(c['per_seed'])} seeds 95 % {seeds_alone['low']:+.2f} to "
                        f"{seeds_alone['high']:+.2f} ({seeds_alone['verdict']})" if seeds_alone else "")
                lines.append("  - per seed: " + ", ".join(f"{d:+.2f} (seed {s})" for s, d in c["per_seed"].items())
                             + over)
            if c.get("largest"):
                shown = "; ".join(f"seed {x['seed']} client {x['client']}"
                                  + (f" ({x['test_samples']} test samples)" if x["test_samples"] is not None else "")
                                  + f" {x['diff']:+.2f}" for x in c["largest"])
                without = (f"; the mean without the first: {c['mean_without_largest']:+.2f}"
                           if "mean_without_largest" in c else "")
                lines.append(f"  - largest per-client differences: {shown}{without}")
        if r["form"] == "delta" and r.get("paper_delta") is not None:
            inside = r.get("paper_delta_inside")
            lines.append(f"- the paper's difference: {r['paper_delta']:+.2f}"
                         + ("" if inside is None else f" ({'inside' if inside else 'outside'} our interval)"))
        lines += ["", f"**Verdict: {_verdict_words(r)}**" + (f" ({r['why']})" if r.get("why") else "")]
    return "\n".join(lines) + "\n"


def _verdict_words(r: dict[str, Any]) -> str:
    alone = r.get("seeds_alone")
    return (r["verdict"] + (", one seed" if r.get("one_seed") else "")
            + (f"; on the seeds alone {alone}" if alone is not None and alone != r["verdict"] else ""))


def write_claims(results: list[dict[str, Any]], out: Path, study: str) -> list[Path]:
    """``claims.md`` and ``claims.json`` in ``out``."""
    (out / "claims.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "claims.md").write_text(claims_markdown(results, study))
    return [out / "claims.md", out / "claims.json"]
