"""``fedpers report DIR``: a sweep's paper-style table and figures.

* ``table.md`` / ``table.csv``: rows = methods, columns = dataset x alpha, cells = mean +- std over seeds
  (in %) of each row's metric (its own headline metric unless the sweep names one, or ``--metric`` one for
  all rows) at the final round, the best evaluated round or over the last 5 evaluated rounds
  (``--value``); the paper's numbers beside them when the sweep has them; best mean in bold; a second
  table with each seed's best evaluated round.
* ``split_<dataset>_a<alpha>_seed<s>.png``: each split's clients x classes counts.
* ``curves_<dataset>_a<alpha>.png``: accuracy vs round, mean with a +-std band over seeds (the pFedKDH
  paper's Fig. 2).
* ``ablation_<dataset>_a<alpha>.png`` (sweeps with ``ablation: true``): bars in row order with the change
  from the previous bar (the paper's Fig. 3).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from fedpers.errors import ConfigError
from fedpers.results import read_metrics
from fedpers.sweep import MethodEntry, PlannedRun, Sweep, dataset_tag, read_plan


def _runs_for(entry: MethodEntry, dataset: str, alpha: float, runs: list[PlannedRun]) -> list[PlannedRun]:
    return [r for r in runs if r.run_key == entry.run_key and r.dataset == dataset and r.alpha == alpha]


def _metric_of(entry: MethodEntry, summary: dict, metric: str | None = None) -> str:
    return metric or entry.metric or summary["metric"]


# Which value of a run a table cell shows: the last round's (the pFedKDH paper's "final accuracy"), the best
# evaluated round's (the JDFL paper's "maximum accuracy"), or the mean of the last 5 evaluated rounds.
VALUES = {"final": "final", "best": "best", "last5": "mean_last_5_evaluated"}
VALUE_WORDS = {"final": "Final-round", "best": "Best-evaluated-round", "last5": "Mean of the last 5 evaluated rounds'"}


def collect(sweep: Sweep, runs: list[PlannedRun], *, value: str = "final",
            metric: str | None = None) -> dict[tuple[str, str, float], dict]:
    """(label, dataset, alpha) -> {"values": % per finished seed (``value`` of the row's metric, or of
    ``metric`` for every row), "curves": per-round % per seed, "best": (round, %) per seed, "splits":
    each finished seed's client label counts}."""
    cells: dict[tuple[str, str, float], dict] = {}
    for entry in sweep.methods:
        for dataset in sweep.datasets:
            for alpha in sweep.alphas:
                values, curves, splits = [], [], {}
                for run in _runs_for(entry, dataset, alpha, runs):
                    summary_path = Path(run.run_dir) / "summary.json"
                    if not summary_path.exists():
                        continue
                    summary = json.loads(summary_path.read_text())
                    name = _metric_of(entry, summary, metric)
                    chosen = summary.get(VALUES[value], {}).get(name)
                    if chosen is None:
                        continue
                    values.append(100.0 * chosen)
                    curves.append([(r["round"], 100.0 * r[name]) for r in read_metrics(run.run_dir)
                                   if r.get(name) is not None])
                    if summary.get("client_label_counts"):
                        splits[run.seed] = summary["client_label_counts"]
                best = [max(curve, key=lambda point: point[1]) for curve in curves if curve]
                cells[(entry.label, dataset, alpha)] = {"values": values, "curves": curves, "best": best,
                                                        "splits": splits}
    return cells


def _columns(sweep: Sweep) -> list[tuple[str, float]]:
    return [(d, a) for d in sweep.datasets for a in sweep.alphas]


def write_tables(sweep: Sweep, cells: dict, out: Path, *, value: str = "final",
                 metric: str | None = None) -> tuple[Path, Path]:
    """``table.md`` and ``table.csv``; the best mean per column is bold in the markdown table."""
    cols = _columns(sweep)
    best = {}
    for d, a in cols:
        means = [np.mean(cells[(m.label, d, a)]["values"]) for m in sweep.methods if cells[(m.label, d, a)]["values"]]
        best[(d, a)] = max(means) if means else None
    def paper_of(label: str, d: str, a: float) -> float | None:
        return sweep.paper.get(label, {}).get(f"{dataset_tag(d)}_a{a:g}")

    with_paper = [(d, a) for d, a in cols if any(paper_of(m.label, d, a) is not None for m in sweep.methods)]
    header = "| method | " + " | ".join(
        f"{dataset_tag(d)} α={a:g}" + (" | paper | diff" if (d, a) in with_paper else "") for d, a in cols) + " |"
    lines = [header, "|---|" + "---|" * (len(cols) + 2 * len(with_paper))]
    with (out / "table.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method"] + [f"{dataset_tag(d)}_a{a:g}_{s}" for d, a in cols for s in ("mean", "std", "n")])
        for m in sweep.methods:
            md_cells, csv_cells = [], []
            for d, a in cols:
                vals = cells[(m.label, d, a)]["values"]
                paper = paper_of(m.label, d, a)
                if not vals:
                    md_cells.append("–")
                    csv_cells += ["", "", 0]
                else:
                    mean, std = float(np.mean(vals)), float(np.std(vals))
                    text = f"{mean:.2f}±{std:.2f}"
                    md_cells.append(f"**{text}**" if best[(d, a)] is not None and np.isclose(mean, best[(d, a)])
                                    else text)
                    csv_cells += [f"{mean:.4f}", f"{std:.4f}", len(vals)]
                if (d, a) in with_paper:
                    md_cells.append("–" if paper is None else f"{paper:.2f}")
                    md_cells.append("" if paper is None or not vals else f"{float(np.mean(vals)) - paper:+.2f}")
            lines.append(f"| {m.label} | " + " | ".join(md_cells) + " |")
            writer.writerow([m.label] + csv_cells)
    seeds = ", ".join(map(str, sweep.seeds))
    which = (f"every row: {metric}" if metric else "shared-model methods: global accuracy; personalized methods: "
             "personalized macro accuracy (equal weight per client) unless a row names its metric")
    note = (f"\n{VALUE_WORDS[value]} accuracy in %, mean ± std over seeds {seeds} (finished runs only); {which}; "
            "best mean per column in bold." + (" 'paper': the paper's reported value; 'diff': ours - paper." if
                                               with_paper else "") + "\n")
    lines += ["", "Best evaluated round (max over the rounds evaluated; per seed: value % (round)):", "",
              "| method | " + " | ".join(f"{dataset_tag(d)} α={a:g}" for d, a in cols) + " |",
              "|---|" + "---|" * len(cols)]
    for m in sweep.methods:
        lines.append(f"| {m.label} | " + " | ".join(
            ", ".join(f"{value:.2f} ({rnd})" for rnd, value in cells[(m.label, d, a)]["best"]) or "–"
            for d, a in cols) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n" + note)
    return out / "table.md", out / "table.csv"


def write_figures(sweep: Sweep, cells: dict, out: Path) -> list[Path]:
    """Accuracy-vs-round curves (mean ± std band) and, for ablation sweeps, the bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for d, a in _columns(sweep):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        drawn = False
        for m in sweep.methods:
            curves = cells[(m.label, d, a)]["curves"]
            if not curves:
                continue
            rounds = sorted(set.intersection(*[{r for r, _ in c} for c in curves]))
            if not rounds:
                continue
            data = np.array([[dict(c)[r] for r in rounds] for c in curves])
            mean, std = data.mean(axis=0), data.std(axis=0)
            ax.plot(rounds, mean, label=m.label)
            ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
            drawn = True
        if drawn:
            ax.set(xlabel="communication round", ylabel="accuracy (%)", title=f"{dataset_tag(d)}, α = {a:g}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            path = out / f"curves_{dataset_tag(d)}_a{a:g}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=120)
            paths.append(path)
        plt.close(fig)
        if sweep.ablation:
            means = [np.mean(cells[(m.label, d, a)]["values"]) if cells[(m.label, d, a)]["values"] else np.nan
                     for m in sweep.methods]
            stds = [np.std(cells[(m.label, d, a)]["values"]) if cells[(m.label, d, a)]["values"] else 0.0
                    for m in sweep.methods]
            if np.all(np.isnan(means)):
                continue
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            x = np.arange(len(means))
            ax.bar(x, np.nan_to_num(means), yerr=stds, color="tab:blue", alpha=0.8)
            for i, value in enumerate(means):
                if np.isnan(value):
                    continue
                label = f"{value:.2f}" if i == 0 or np.isnan(means[i - 1]) else f"{value:.2f}\n({value - means[i - 1]:+.2f})"
                ax.annotate(label, (i, value), ha="center", va="bottom", fontsize=8)
            finite = [v for v in means if not np.isnan(v)]
            ax.set_ylim(max(0.0, min(finite) - 5), min(100.0, max(finite) + 3))
            ax.set_xticks(x, [m.label for m in sweep.methods], rotation=20, ha="right", fontsize=8)
            ax.set(ylabel="accuracy (%)", title=f"component ablation: {dataset_tag(d)}, α = {a:g}")
            fig.tight_layout()
            path = out / f"ablation_{dataset_tag(d)}_a{a:g}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            paths.append(path)
    return paths


def write_splits(sweep: Sweep, cells: dict, out: Path) -> list[Path]:
    """``split_<dataset>_a<alpha>_seed<s>.png``: the clients x classes counts of each split of the sweep
    (the runs of one dataset, alpha and seed share their split: it is drawn from the first finished one)."""
    from fedpers.run_figures import label_distribution_png

    paths = []
    for d, a in _columns(sweep):
        drawn: set[int] = set()
        for m in sweep.methods:
            for seed, counts in cells[(m.label, d, a)]["splits"].items():
                if seed not in drawn:
                    drawn.add(seed)
                    path = label_distribution_png(counts, out / f"split_{dataset_tag(d)}_a{a:g}_seed{seed}.png")
                    paths += [path] if path else []
    return paths


def report(out: str | Path, *, value: str = "final", metric: str | None = None) -> list[Path]:
    """Write the table and figures of the sweep in ``out``; returns the files written. ``value``: which
    value of each run (``final``, ``best``, ``last5``); ``metric``: one accuracy for every row instead of
    each row's own (e.g. ``personalized_weighted_acc``)."""
    if value not in VALUES:
        raise ConfigError(f"report: value must be one of {', '.join(VALUES)}, got {value!r}")
    out = Path(out)
    sweep, runs = read_plan(out)
    cells = collect(sweep, runs, value=value, metric=metric)
    md, csv_path = write_tables(sweep, cells, out, value=value, metric=metric)
    return [md, csv_path, *write_figures(sweep, cells, out), *write_splits(sweep, cells, out)]
