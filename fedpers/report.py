"""``fedpers report DIR``: a sweep's paper-style table and figures.

* ``table.md`` / ``table.csv``: rows = methods, columns = dataset x alpha, cells = mean +- std over seeds
  (in %) of each row's metric (its own headline metric unless the sweep names one); best mean in bold.
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

from fedpers.results import read_metrics
from fedpers.sweep import MethodEntry, PlannedRun, Sweep, dataset_tag, read_plan


def _runs_for(entry: MethodEntry, dataset: str, alpha: float, runs: list[PlannedRun]) -> list[PlannedRun]:
    return [r for r in runs if r.run_key == entry.run_key and r.dataset == dataset and r.alpha == alpha]


def _metric_of(entry: MethodEntry, summary: dict) -> str:
    return entry.metric or summary["metric"]


def collect(sweep: Sweep, runs: list[PlannedRun]) -> dict[tuple[str, str, float], dict]:
    """(label, dataset, alpha) -> {"values": final % per finished seed, "curves": per-round % per seed}."""
    cells: dict[tuple[str, str, float], dict] = {}
    for entry in sweep.methods:
        for dataset in sweep.datasets:
            for alpha in sweep.alphas:
                values, curves = [], []
                for run in _runs_for(entry, dataset, alpha, runs):
                    summary_path = Path(run.run_dir) / "summary.json"
                    if not summary_path.exists():
                        continue
                    summary = json.loads(summary_path.read_text())
                    metric = _metric_of(entry, summary)
                    final = summary["final"].get(metric)
                    if final is None:
                        continue
                    values.append(100.0 * final)
                    curves.append([(r["round"], 100.0 * r[metric]) for r in read_metrics(run.run_dir)
                                   if r.get(metric) is not None])
                best = [max(curve, key=lambda point: point[1]) for curve in curves if curve]
                cells[(entry.label, dataset, alpha)] = {"values": values, "curves": curves, "best": best}
    return cells


def _columns(sweep: Sweep) -> list[tuple[str, float]]:
    return [(d, a) for d in sweep.datasets for a in sweep.alphas]


def write_tables(sweep: Sweep, cells: dict, out: Path) -> tuple[Path, Path]:
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
    note = (f"\nFinal-round accuracy in %, mean ± std over seeds {seeds} (finished runs only). Shared-model methods: "
            "global accuracy; personalized methods: personalized macro accuracy (equal weight per client); best "
            "mean per column in bold." + (" 'paper': the paper's reported value; 'diff': ours - paper." if with_paper
                                          else "") + "\n")
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


def report(out: str | Path) -> list[Path]:
    """Write the table and figures of the sweep in ``out``; returns the files written."""
    out = Path(out)
    sweep, runs = read_plan(out)
    cells = collect(sweep, runs)
    md, csv_path = write_tables(sweep, cells, out)
    return [md, csv_path, *write_figures(sweep, cells, out)]
