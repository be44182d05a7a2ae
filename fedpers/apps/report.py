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
* ``versus.md`` (``--versus LABEL``): every other row against row LABEL, paired over the clients of the same
  split (same seed, same clients' label counts and ``aux_size``; other runs are listed as not paired): the
  difference of the per-client accuracies at the last common round and averaged over
  the last 5 common evaluated rounds, its standard error over clients and the clients higher / lower / equal;
  then each row pooled over the seeds at the final round with the claims' 95 % interval.
  One seed's split cannot show the seed-to-seed spread; this says whether a gap is consistent across clients
  or rests on a few of them (e.g. a client with 6 test samples moves a 20-client macro mean by 0.83 points
  per sample).
* ``validation.md`` and ``curves_val_<dataset>_a<alpha>.png`` (runs with ``val_fraction`` > 0): each row's
  accuracy on the clients' validation splits beside its test accuracy, and which row of each method (and
  metric, or of each ``group`` the sweep names) has the highest validation accuracy, averaged over the last 5
  evaluated rounds: the value chosen.
  The test columns never take part in the choice.
* ``round_statistics.md`` (runs whose ``summary.json`` names ``round_statistics``, e.g. FedEAGD's drift and
  distillation coefficient): each statistic at a few rounds, its minimum and maximum over all rounds, mean
  over the finished seeds.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from fedpers.core.errors import ConfigError, shown
from fedpers.core.results import VALIDATION_PREFIX, read_metrics
from fedpers.apps.sweep import MethodEntry, PlannedRun, Sweep, check_finished_runs, dataset_tag, read_plan


def _runs_for(entry: MethodEntry, dataset: str, alpha: float, runs: list[PlannedRun]) -> list[PlannedRun]:
    return [r for r in runs if r.run_key == entry.run_key and r.dataset == dataset and r.alpha == alpha]


def _metric_of(entry: MethodEntry, summary: dict, metric: str | None = None) -> str:
    return metric or entry.metric or summary["metric"]


def validation_metric(metric: str) -> str:
    """The validation-split counterpart of a test metric: ``val_<metric>``; for the shared model's
    ``global_acc``, its clients' mean accuracy on their validation splits (no global validation set)."""
    return VALIDATION_PREFIX + ("personalized_macro_acc" if metric == "global_acc" else metric)


# Which value of a run a table cell shows: the last round's (the pFedKDH paper's "final accuracy"), the best
# evaluated round's (the JDFL paper's "maximum accuracy"), or the mean of the last 5 evaluated rounds.
VALUES = {"final": "final", "best": "best", "last5": "mean_last_5_evaluated"}
VALUE_WORDS = {"final": "Final-round", "best": "Best-evaluated-round", "last5": "Mean of the last 5 evaluated rounds'"}


def collect(sweep: Sweep, runs: list[PlannedRun], *, value: str = "final",
            metric: str | None = None, validation: bool = False) -> dict[tuple[str, str, float], dict]:
    """(label, dataset, alpha) -> {"values": % per finished seed (``value`` of the row's metric, or of
    ``metric`` for every row; with ``validation``, of its :func:`validation_metric`), "curves": per-round %
    per seed, "seeds": the seed of each value, "best": (round, %) per seed, "splits": each finished seed's
    client label counts}."""
    cells: dict[tuple[str, str, float], dict] = {}
    for entry in sweep.methods:
        for dataset in sweep.datasets:
            for alpha in sweep.alphas:
                values, seeds, curves, splits, sample = [], [], [], {}, None
                for run in _runs_for(entry, dataset, alpha, runs):
                    summary_path = Path(run.run_dir) / "summary.json"
                    if not summary_path.exists():
                        continue
                    summary = json.loads(summary_path.read_text())
                    name = _metric_of(entry, summary, metric)
                    name = validation_metric(name) if validation else name
                    chosen = summary.get(VALUES[value], {}).get(name)
                    if chosen is None:
                        continue
                    values.append(100.0 * chosen)
                    seeds.append(run.seed)
                    curves.append([(r["round"], 100.0 * r[name]) for r in read_metrics(run.run_dir)
                                   if r.get(name) is not None])
                    if summary.get("client_label_counts"):
                        splits[run.seed] = summary["client_label_counts"]
                    sample = summary.get("evaluation_sample") or sample
                    if summary.get("evaluated_among") == "trained":
                        sample = f"{sample or 'all'} of the trained"
                best = [max(curve, key=lambda point: point[1]) for curve in curves if curve]
                cells[(entry.label, dataset, alpha)] = {"values": values, "seeds": seeds, "curves": curves,
                                                        "best": best, "splits": splits, "sample": sample}
    return cells


def _columns(sweep: Sweep) -> list[tuple[str, float]]:
    return [(d, a) for d in sweep.datasets for a in sweep.alphas]


def mean_sd_text(values: list[float], *, with_n: bool = True) -> str:
    """A cell of a table: ``mean ± sample SD (n=k)`` (ddof 1), or ``value (n=1)`` where one seed gives no SD;
    ``with_n=False`` for a table whose n has a column of its own."""
    if not values:
        return "–"
    n = f" (n={len(values)})" if with_n else ""
    if len(values) == 1:
        return f"{values[0]:.2f}{n}"
    return f"{np.mean(values):.2f}±{np.std(values, ddof=1):.2f}{n}"


def write_tables(sweep: Sweep, cells: dict, out: Path, *, value: str = "final",
                 metric: str | None = None, last5: dict | None = None) -> tuple[Path, Path]:
    """``table.md`` and ``table.csv``: mean ± sample SD (ddof 1) over the finished seeds, with n, in every
    cell; the best mean per column is bold in the markdown table. A column whose rows finished different
    seeds bolds no mean; a per-seed table then sets each seed's values side by side, its best in bold.
    ``last5`` (cells of :func:`collect` at ``last5``): a second table of the mean of the last 5 evaluated
    rounds, which says whether one round's value is stable."""
    cols = _columns(sweep)
    # a column whose rows finished different seeds sets means of different splits side by side: no mean of
    # it is "best", and a per-seed table marks each seed's best instead
    same_seeds = {(d, a): len({tuple(cells[(m.label, d, a)]["seeds"]) for m in sweep.methods
                               if cells[(m.label, d, a)]["values"]}) <= 1 for d, a in cols}
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
        writer.writerow(["method"] + [f"{dataset_tag(d)}_a{a:g}_{s}" for d, a in cols for s in ("mean", "sd", "n")])
        for m in sweep.methods:
            md_cells, csv_cells = [], []
            for d, a in cols:
                vals = cells[(m.label, d, a)]["values"]
                paper = paper_of(m.label, d, a)
                if not vals:
                    md_cells.append("–")
                    csv_cells += ["", "", 0]
                else:
                    mean = float(np.mean(vals))
                    sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
                    text = mean_sd_text(vals)
                    md_cells.append(f"**{text}**" if same_seeds[(d, a)] and best[(d, a)] is not None
                                    and np.isclose(mean, best[(d, a)]) else text)
                    csv_cells += [f"{mean:.4f}", "" if sd is None else f"{sd:.4f}", len(vals)]
                if (d, a) in with_paper:
                    md_cells.append("–" if paper is None else f"{paper:.2f}")
                    md_cells.append("" if paper is None or not vals else f"{float(np.mean(vals)) - paper:+.2f}")
            lines.append(f"| {m.label} | " + " | ".join(md_cells) + " |")
            writer.writerow([m.label] + csv_cells)
    seeds = ", ".join(map(str, sweep.seeds))
    own = {}
    for m in sweep.methods:
        if sweep.seeds_of(m) != sweep.seeds:
            own.setdefault(", ".join(map(str, sweep.seeds_of(m))), []).append(m.label)
    if own:
        seeds += " (" + "; ".join(f"{', '.join(labels)}: {listed}" for listed, labels in own.items()) + ")"
    which = (f"every row: {metric}" if metric else "shared-model methods: global accuracy; personalized methods: "
             "personalized macro accuracy (equal weight per client) unless a row names its metric")
    sampled = sorted({str(c["sample"]) for c in cells.values() if c.get("sample")})
    keys = "eval_clients, eval_among" if any("trained" in x for x in sampled) else "eval_clients"
    which += (f"; personalized figures average a sample of {', '.join(sampled)} clients per evaluation "
              f"({keys}), not every client" if sampled else "")
    bold = ("best mean per column in bold" if all(same_seeds.values()) else
            "best mean in bold only in a column whose rows finished the same seeds (means over different seeds "
            "are of different splits): each seed's best value is bold in the per-seed table")
    note = (f"\n{VALUE_WORDS[value]} accuracy in %, mean ± sample SD (ddof 1) over seeds {seeds} with n (finished "
            f"runs only); {which}; "
            f"{bold}." + (" 'paper': the paper's reported value; 'diff': ours - paper." if
                                               with_paper else "") + "\n")
    if not all(same_seeds.values()):
        # a mean over seeds 0-2 and a value of seed 0 are of different splits, so the values of each seed
        # are set side by side, to be compared seed with seed
        lines += ["", f"{VALUE_WORDS[value]} accuracy per seed (rows finished at different seeds: compare within a "
                      "seed, each seed being its own split):", "",
                  "| method | " + " | ".join(f"{dataset_tag(d)} α={a:g}" for d, a in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        seed_best: dict[tuple[str, float, int], float] = {}
        for m in sweep.methods:
            for d, a in cols:
                for seed, v in zip(cells[(m.label, d, a)]["seeds"], cells[(m.label, d, a)]["values"]):
                    seed_best[(d, a, seed)] = max(v, seed_best.get((d, a, seed), v))

        def per_seed(label: str, d: str, a: float) -> str:
            shown = [f"seed {seed}: " + (f"**{v:.2f}**" if np.isclose(v, seed_best[(d, a, seed)]) else f"{v:.2f}")
                     for seed, v in zip(cells[(label, d, a)]["seeds"], cells[(label, d, a)]["values"])]
            return ", ".join(shown) or "–"

        for m in sweep.methods:
            lines.append(f"| {m.label} | " + " | ".join(per_seed(m.label, d, a) for d, a in cols) + " |")
    if last5 is not None and value != "last5":
        lines += ["", f"{VALUE_WORDS['last5']} accuracy (mean ± sample SD over seeds, n): is one round's value "
                      "stable?", "", "| method | " + " | ".join(f"{dataset_tag(d)} α={a:g}" for d, a in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for m in sweep.methods:
            lines.append(f"| {m.label} | " + " | ".join(mean_sd_text(last5[(m.label, d, a)]["values"])
                                                       for d, a in cols) + " |")
    lines += ["", "Best evaluated round (max over the rounds evaluated; per seed: value % (round)):", "",
              "| method | " + " | ".join(f"{dataset_tag(d)} α={a:g}" for d, a in cols) + " |",
              "|---|" + "---|" * len(cols)]
    for m in sweep.methods:
        lines.append(f"| {m.label} | " + " | ".join(
            ", ".join(f"{value:.2f} ({rnd})" for rnd, value in cells[(m.label, d, a)]["best"]) or "–"
            for d, a in cols) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n" + note)
    return out / "table.md", out / "table.csv"


def write_figures(sweep: Sweep, cells: dict, out: Path, *, split: str = "test") -> list[Path]:
    """Accuracy-vs-round curves (mean ± std band) and, for ablation sweeps, the bar chart; ``split="val"``:
    the validation curves only (``curves_val_*.png``)."""
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
            ax.set(xlabel="communication round", ylabel=f"{'validation ' if split == 'val' else ''}accuracy (%)",
                   title=f"{dataset_tag(d)}, α = {a:g}" + (" (clients' validation splits)" if split == "val" else ""))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            path = out / f"curves_{'val_' if split == 'val' else ''}{dataset_tag(d)}_a{a:g}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=120)
            paths.append(path)
        plt.close(fig)
        if sweep.ablation and split == "test":
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
    """``split_<dataset>_a<alpha>_seed<s>.png``: the clients x classes counts of each split of the sweep,
    drawn from the first finished run of a dataset, alpha and seed. A row whose runs split the data otherwise
    (e.g. it sets ``aux_size``, which removes the server's set from the clients first) gets its own figure,
    ``split_<dataset>_a<alpha>_seed<s>_<row's run key>.png``."""
    from fedpers.core.run_figures import label_distribution_png

    paths = []
    for d, a in _columns(sweep):
        drawn: dict[int, list] = {}
        for m in sweep.methods:
            for seed, counts in cells[(m.label, d, a)]["splits"].items():
                if counts in drawn.setdefault(seed, []):
                    continue
                suffix = f"_{m.run_key}" if drawn[seed] else ""
                drawn[seed].append(counts)
                path = label_distribution_png(counts,
                                              out / f"split_{dataset_tag(d)}_a{a:g}_seed{seed}{suffix}.png")
                paths += [path] if path else []
    return paths


def paired_client_difference(ours: dict[str, float], reference: dict[str, float]) -> dict[str, float]:
    """Paired comparison of two runs' per-client accuracies (fractions) on the same split: over the clients
    both evaluated (K), the mean of ``ours - reference`` in points (for all clients evaluated, the difference
    of the two personalized macro accuracies), its standard error over clients (sample std of the per-client
    differences / sqrt(K)), and how many clients are higher, lower or equal. No paper equation: a diagnostic
    for "is the gap within the spread"."""
    clients = sorted(set(ours) & set(reference), key=str)
    if not clients:
        return {"clients": 0}
    diffs = 100.0 * np.array([float(ours[c]) - float(reference[c]) for c in clients])
    se = float(diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else float("nan")
    return {"clients": len(diffs), "diff": float(diffs.mean()), "se": se,
            "higher": int(np.sum(diffs > 1e-9)), "lower": int(np.sum(diffs < -1e-9)),
            "equal": int(np.sum(np.abs(diffs) <= 1e-9))}


def _per_client_curve(run_dir: str) -> dict[int, dict[str, float]]:
    """Round -> per-client accuracy of a run's evaluated rounds that have them."""
    return {r["round"]: r["per_client_acc"] for r in read_metrics(run_dir) if r.get("per_client_acc")}


def _mean_of_clients(curve: dict[int, dict[str, float]], rounds: list[int]) -> dict[str, float]:
    clients = set.intersection(*[set(curve[r]) for r in rounds])
    return {c: float(np.mean([curve[r][c] for r in rounds])) for c in clients}


def _split_difference(run_dir: str, reference_dir: str) -> str | None:
    """Why two runs of one dataset, alpha and seed do not share their clients' data (None when they do, as
    far as their summaries tell): pairing their clients would compare different data."""
    ours, ref = (json.loads((Path(d) / "summary.json").read_text()) for d in (run_dir, reference_dir))
    if ours.get("aux_size", 0) != ref.get("aux_size", 0):
        return f"another split (aux_size {ours.get('aux_size', 0)} vs {ref.get('aux_size', 0)})"
    counts = ours.get("client_label_counts"), ref.get("client_label_counts")
    if all(counts) and counts[0] != counts[1]:  # summaries written before the counts were recorded lack them
        return "another split (the clients' label counts differ)"
    sizes = ours.get("client_train_sizes"), ref.get("client_train_sizes")
    if all(sizes) and sizes[0] != sizes[1]:
        return "another split (the clients' train sizes differ)"
    return None


def _reads_per_client(entry: MethodEntry) -> bool:
    return entry.metric in (None, "", "personalized_macro_acc")


def write_versus(sweep: Sweep, runs: list[PlannedRun], references: str | list[str], out: Path) -> Path:
    """``versus.md``: for each of ``references`` in turn, the comparison of every row with it
    (:func:`versus_text`)."""
    references = [references] if isinstance(references, str) else list(references)
    texts = [versus_text(sweep, runs, reference) for reference in references]
    path = out / "versus.md"
    path.write_text("\n\n".join(texts))
    return path


def versus_text(sweep: Sweep, runs: list[PlannedRun], reference: str) -> str:
    """Each row against row ``reference``, paired per client (:func:`paired_client_difference`)
    at their last common evaluated round and over their last 5 common evaluated rounds, per dataset, alpha
    and seed with both runs finished. Runs whose clients hold other data (another ``aux_size``, other label
    counts) are listed as not paired."""
    entries = {m.label: m for m in sweep.methods}
    if reference not in entries:
        raise ConfigError(f"report: --versus {reference!r} is not a row of the sweep (rows: "
                          f"{', '.join(entries)})")
    # per_client_acc holds the accuracies behind personalized_macro_acc: a row reading another metric of
    # its run (pFedKDH-Fair) has no per-client values of its own, and rows sharing a run get one line
    if not _reads_per_client(entries[reference]):
        raise ConfigError(f"report: --versus {reference!r} reads metric {entries[reference].metric!r}, which "
                          "has no per-client accuracies (per_client_acc is of personalized_macro_acc)")
    def finished(entry: MethodEntry, d: str, a: float) -> dict[int, PlannedRun]:
        return {r.seed: r for r in _runs_for(entry, d, a, runs) if (Path(r.run_dir) / "summary.json").exists()}

    def cell(result: dict[str, float]) -> str:
        if not result.get("clients"):
            return "– | – | –"
        return (f"{result['diff']:+.2f} | {result['se']:.2f} | "
                f"{result['higher']}/{result['lower']}/{result['equal']}")

    lines = [f"# Against {reference}", "", f"Each row against **{reference}**, paired over the clients of the same split (per-client "
             "personalized accuracy, `per_client_acc`): mean per-client difference in points (row - "
             f"{reference}), its standard error over clients, and clients higher/lower/equal; at the last "
             "common evaluated round and averaged over the last 5 common evaluated rounds. Finished runs only; "
             "the seed-to-seed spread needs more seeds.", "",
             "| method | split | seed | K | round | diff | SE | higher/lower/equal | last 5 rounds | diff | SE "
             "| higher/lower/equal |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    per_round: list[tuple[str, dict, dict, list[int]]] = []
    for d, a in _columns(sweep):
        base = finished(entries[reference], d, a)
        compared = {entries[reference].run_key}
        for m in sweep.methods:
            if m.run_key in compared or not _reads_per_client(m):
                continue
            compared.add(m.run_key)
            for seed, run in sorted(finished(m, d, a).items()):
                if seed not in base:
                    continue
                other_split = _split_difference(run.run_dir, base[seed].run_dir)
                if other_split:
                    lines.append(f"| {m.label} | {dataset_tag(d)} α={a:g} | {seed} | – | – | not paired: "
                                 f"{other_split} | | | | | | |")
                    continue
                ours, ref = _per_client_curve(run.run_dir), _per_client_curve(base[seed].run_dir)
                common = sorted(set(ours) & set(ref))
                if not common:
                    lines.append(f"| {m.label} | {dataset_tag(d)} α={a:g} | {seed} | – | – | no per-client "
                                 "accuracies in both runs | | | | | | |")
                    continue
                last, last5 = common[-1], common[-5:]
                at_last = paired_client_difference(ours[last], ref[last])
                over5 = paired_client_difference(_mean_of_clients(ours, last5), _mean_of_clients(ref, last5))
                lines.append(f"| {m.label} | {dataset_tag(d)} α={a:g} | {seed} | {at_last.get('clients', 0)} | "
                             f"{last} | {cell(at_last)} | {last5[0]}-{last5[-1]} | {cell(over5)} |")
                per_round.append((f"{m.label}, {dataset_tag(d)} α={a:g}, seed {seed}", ours, ref, common))
    lines += pooled_versus_lines(sweep, runs, reference)
    # every common evaluated round: where along training a gap opens or closes
    lines += ["", f"## Every common evaluated round (row - {reference}; diff ± SE, clients higher/lower/equal)"]
    for title, ours, ref, common in per_round:
        lines += ["", f"### {title}", "", "| round | row | " + reference + " | diff ± SE | higher/lower/equal |",
                  "|---|---|---|---|---|"]
        for rnd in common:
            result = paired_client_difference(ours[rnd], ref[rnd])
            lines.append(f"| {rnd} | {100 * np.mean(list(ours[rnd].values())):.2f} | "
                         f"{100 * np.mean(list(ref[rnd].values())):.2f} | {result['diff']:+.2f} ± {result['se']:.2f} | "
                         f"{result['higher']}/{result['lower']}/{result['equal']} |")
    return "\n".join(lines) + "\n"


def pooled_versus_lines(sweep: Sweep, runs: list[PlannedRun], reference: str) -> list[str]:
    """versus.md's pooled section: each row minus ``reference`` in personalized macro accuracy at the final
    round, over the seeds both finished, with the headline 95 % Student's t interval of the claims
    (:func:`fedpers.apps.claims.compare`: from three seeds on over the seeds' own differences, below that
    paired per client where every seed's two runs share a split, else paired over seeds)."""
    from fedpers.apps.claims import PER_CLIENT_METRIC, compare, row_runs

    entries = {m.label: m for m in sweep.methods}
    lines = ["", f"## Over the seeds (row - {reference}, final round, 95 % Student's t interval: from three seeds the "
                 "seed is the unit, below that the clients of the runs)", "",
             "| method | split | seeds | paired over | diff | 95 % | higher/lower | per seed |",
             "|---|---|---|---|---|---|---|---|"]
    for d, a in _columns(sweep):
        def finished(entry: MethodEntry) -> dict:
            dirs = {r.seed: r.run_dir for r in _runs_for(entry, d, a, runs)}
            # the metric behind per_client_acc for every row, as in the per-seed table above (FedAvg's
            # headline is its global accuracy, whose clients are not recorded)
            return row_runs(dirs, PER_CLIENT_METRIC, None, "final")

        ref = finished(entries[reference])
        compared = {entries[reference].run_key}
        for m in sweep.methods:
            if m.run_key in compared or not _reads_per_client(m):
                continue
            compared.add(m.run_key)
            result = compare(finished(m), ref)
            if not result["n"]:
                continue
            seeds = ", ".join(str(s) for s in result["seeds"])
            span = f"{result['low']:+.2f} to {result['high']:+.2f}" if "low" in result else "–"
            if result["paired"] == "clients":
                over = f"{result['pairs']} client pairs"
            else:
                over = f"{result['pairs']} seeds" + (f" ({result['client_pairs']} client pairs)"
                                                      if "client_pairs" in result else "")
            counts = f"{result['higher']}/{result['lower']}" if "higher" in result else "–"
            # the mean the interval is about: of the per-client differences, or of the seeds' differences
            lines.append(f"| {m.label} | {dataset_tag(d)} α={a:g} | {seeds} | {over} | "
                         f"{result.get('mean', result['diff']):+.2f} | "
                         f"{span} | {counts} | {', '.join(f'{x:+.2f}' for x in result['per_seed'].values())} |")
    return lines


def write_study_claims(sweep: Sweep, runs: list[PlannedRun], out: Path) -> list[Path]:
    """``claims.md`` / ``claims.json``: the verdict of each claim the study declares (fedpers/apps/claims.py)."""
    from dataclasses import replace

    from fedpers.apps.claims import judge, parse_claims, readings_of, row_runs, write_claims

    labels = [m.label for m in sweep.methods]
    claims = parse_claims(sweep.claims, labels, sweep.columns, sweep.paper, f"{out}/sweep.json")
    entries = {m.label: m for m in sweep.methods}
    columns = {f"{dataset_tag(d)}_a{a:g}": (d, a) for d, a in _columns(sweep)}
    results = []
    for claim in claims:
        d, a = columns[claim.column]
        judged = []
        for value in readings_of(claim):
            rows = {label: row_runs({r.seed: r.run_dir for r in _runs_for(entries[label], d, a, runs)}, claim.metric,
                                    entries[label].metric, value)
                    for label in claim.rows}
            judged.append(judge(replace(claim, value=value), rows, sweep.paper))
        results.append({**judged[0], "other_readings": judged[1:]})
    return write_claims(results, out, out.name)


def has_validation(runs: list[PlannedRun]) -> bool:
    """Whether any finished run of the sweep held out a validation split."""
    for run in runs:
        path = Path(run.run_dir) / "summary.json"
        if path.exists() and (json.loads(path.read_text()).get("val_fraction") or 0) > 0:
            return True
    return False


def write_validation(sweep: Sweep, runs: list[PlannedRun], out: Path) -> Path:
    """``validation.md``: per column, each row's validation and test accuracy (mean ± std over seeds), and the
    row each group of rows (sharing a method and a metric, or the sweep's ``group``) would choose: the highest validation accuracy
    averaged over the last 5 evaluated rounds (ours: less noisy than one round). Test accuracy is shown,
    never used."""
    val5 = collect(sweep, runs, value="last5", validation=True)
    valf = collect(sweep, runs, value="final", validation=True)
    test5 = collect(sweep, runs, value="last5")
    testf = collect(sweep, runs, value="final")

    def text(vals: list[float]) -> str:
        return mean_sd_text(vals, with_n=False)  # the row's n has its own column

    lines = ["# Validation and test accuracy", "",
             "Accuracy in %, mean ± sample SD (ddof 1) over the finished seeds (n). 'val': the clients' validation splits "
             "(held out of their training data, `val_fraction`); 'last 5': mean of the last 5 evaluated "
             "rounds. **chosen**: the row with the highest 'val last 5' among the rows of the same method and "
             "metric (or of the same group the study names). Test columns are shown for the record; they choose nothing.", ""]
    for d, a in _columns(sweep):
        lines += [f"## {dataset_tag(d)} α={a:g}", "",
                  "| row | n | val last 5 | val final | test last 5 | test final | |",
                  "|---|---|---|---|---|---|---|"]
        groups: dict[tuple, list[str]] = {}
        for m in sweep.methods:
            if val5[(m.label, d, a)]["values"]:
                groups.setdefault(m.group or (m.method, m.metric), []).append(m.label)
        chosen = {max(labels, key=lambda lab: float(np.mean(val5[(lab, d, a)]["values"])))
                  for labels in groups.values() if len(labels) > 1}
        for m in sweep.methods:
            key = (m.label, d, a)
            lines.append(f"| {m.label} | {len(val5[key]['values'])} | {text(val5[key]['values'])} | "
                         f"{text(valf[key]['values'])} | {text(test5[key]['values'])} | "
                         f"{text(testf[key]['values'])} | {'**chosen**' if m.label in chosen else ''} |")
        lines.append("")
    path = out / "validation.md"
    path.write_text("\n".join(lines))
    return path


def _shown_rounds(last: int) -> list[int]:
    """The rounds a round-statistics table shows: the first two, then about a tenth, a quarter, half and
    all of the run."""
    return sorted({r for r in (1, 2, last // 10, last // 4, last // 2, last) if r >= 1})


def _mean_text(values: list[float]) -> str:
    """The mean of ``values`` with 4 decimals, or blank when there is none."""
    return f"{np.mean(values):.4f}" if values else ""


def write_round_statistics(sweep: Sweep, runs: list[PlannedRun], out: Path) -> Path | None:
    """``round_statistics.md``: per column and row, each statistic its runs' ``summary.json`` names under
    ``round_statistics`` (a method's own per-round figures in its records, e.g. FedEAGD's drift), at the
    rounds :func:`_shown_rounds` picks, and its minimum and maximum over every round with a value; each a
    mean over the finished seeds (n). None (nothing written) when no run names any."""
    lines = ["# Round statistics", "",
             "A method's own figures, recorded every round (training rounds included, evaluated or not); each "
             "cell the mean over the finished seeds (n). Blank: no value that round (e.g. before any client "
             "has a teacher). 'min' / 'max': over all rounds with a value, then the mean over seeds.", ""]
    found = False
    for d, a in _columns(sweep):
        rows = []
        for entry in sweep.methods:
            per_seed: list[dict[str, dict[int, float]]] = []
            names: list[str] = []
            for run in _runs_for(entry, d, a, runs):
                summary_path = Path(run.run_dir) / "summary.json"
                if not summary_path.exists():
                    continue
                names = list(json.loads(summary_path.read_text()).get("round_statistics") or [])
                if names:
                    per_seed.append({name: {r["round"]: float(r[name]) for r in read_metrics(run.run_dir)
                                            if isinstance(r.get(name), (int, float))} for name in names})
            if per_seed:
                rows.append((entry.label, names, per_seed))
        if not rows:
            continue
        found = True
        last = max(max(series, default=0) for _, _, seeds in rows for seed in seeds for series in seed.values())
        shown_rounds = _shown_rounds(last)
        lines += [f"## {dataset_tag(d)} α={a:g}", "",
                  "| row | statistic | n | " + " | ".join(f"round {r}" for r in shown_rounds) + " | min | max |",
                  "|---|---|---|" + "---|" * (len(shown_rounds) + 2)]
        for label, names, seeds in rows:
            for name in names:
                at = [_mean_text([s[name][r] for s in seeds if r in s[name]]) for r in shown_rounds]
                lo = _mean_text([min(s[name].values()) for s in seeds if s[name]])
                hi = _mean_text([max(s[name].values()) for s in seeds if s[name]])
                lines.append(f"| {label} | {name} | {len(seeds)} | " + " | ".join(at) + f" | {lo} | {hi} |")
        lines.append("")
    if not found:
        return None
    path = out / "round_statistics.md"
    path.write_text("\n".join(lines))
    return path


def check_run_files(runs: list[PlannedRun], value: str = "final") -> set[str]:
    """Read every finished run's ``summary.json`` and ``metrics.jsonl`` once, so that a torn line or a
    truncated file (a run killed while writing, a copy cut short) is one error line naming the file and the
    line, not a traceback halfway through the report. Returns the metrics the runs' summaries give for
    ``value`` (what ``--metric`` may name)."""
    metrics: set[str] = set()
    for run in runs:
        summary_path = Path(run.run_dir) / "summary.json"
        if not summary_path.exists():
            continue
        try:
            summary = json.loads(summary_path.read_text())
            if not isinstance(summary, dict) or not isinstance(summary.get("final"), dict):
                raise ValueError("not a run summary")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"report: {summary_path} is not a whole summary.json ({type(exc).__name__}); "
                              "nothing was written") from None
        except OSError as exc:  # a directory, unreadable
            raise ConfigError(f"report: {summary_path} cannot be read ({exc.strerror}); nothing was written") from None
        chosen = summary.get(VALUES[value])
        if not isinstance(chosen, dict):
            raise ConfigError(f"report: {summary_path} records no {VALUES[value]!r} values (a run from before they "
                              f"were recorded?): report another --value; nothing was written")
        broken = sorted(k for k, v in chosen.items() if isinstance(v, float) and not math.isfinite(v))
        if broken:
            raise ConfigError(f"report: {summary_path}: {VALUES[value]} {', '.join(broken)} is not a number (NaN or "
                              "Inf: a broken run); nothing was written")
        metrics.update(k for k, v in chosen.items() if isinstance(v, (int, float)))
        metrics_path = Path(run.run_dir) / "metrics.jsonl"
        try:
            lines = metrics_path.read_text().splitlines() if metrics_path.exists() else []
        except UnicodeDecodeError:
            raise ConfigError(f"report: {metrics_path} is not text; nothing was written") from None
        except OSError as exc:
            raise ConfigError(f"report: {metrics_path} cannot be read ({exc.strerror}); nothing was written") from None
        for number, line in enumerate(lines, 1):
            try:
                if line.strip() and not isinstance(json.loads(line), dict):
                    raise ValueError("not a round record")
            except ValueError:
                raise ConfigError(f"report: {metrics_path} line {number} is not a whole JSON record (a torn "
                                  "write?); nothing was written") from None
    return metrics


def check_writable(out: Path) -> None:
    """A file can be made in ``out`` (a read-only folder or file system is one line before any file is
    written; root passes permission checks, so the folder is tried, not asked)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".fedpers-report-"):
            pass
    except OSError as exc:
        raise ConfigError(f"report: {out} cannot be written ({exc.strerror}); nothing was written") from None


def report(out: str | Path, *, value: str | None = None, metric: str | None = None,
           versus: str | list[str] | None = None) -> list[Path]:
    """Write the table and figures of the sweep in ``out``; returns the files written. ``value``: which
    value of each run (``final``, ``best``, ``last5``); ``metric``: one accuracy for every row instead of
    each row's own (e.g. ``personalized_weighted_acc``); ``versus``: a row's label (or several), to write ``versus.md``
    (:func:`write_versus`). Each left out is the study's own ``report:`` entry, where it declares one
    (``value`` else ``final``): a study's report is regenerated by ``fedpers report DIR`` alone."""
    if value is not None and value not in VALUES:
        raise ConfigError(f"report: value must be one of {', '.join(VALUES)}, got {value!r}")
    out = Path(out)
    sweep, runs = read_plan(out)
    value = value or sweep.report.get("value", "final")
    metric = metric or sweep.report.get("metric")
    versus = versus or sweep.report.get("versus")
    metrics = check_run_files(runs, value)  # before any file is written: a refused report changes nothing
    check_finished_runs(runs, "report")
    check_writable(out)
    if metric and metrics and metric not in metrics:
        raise ConfigError(f"report: --metric {shown(metric)} is not a metric of these runs; they have "
                          f"{', '.join(sorted(metrics))}")
    cells = collect(sweep, runs, value=value, metric=metric)
    last5 = collect(sweep, runs, value="last5", metric=metric) if value != "last5" else None
    md, csv_path = write_tables(sweep, cells, out, value=value, metric=metric, last5=last5)
    extra = [write_versus(sweep, runs, versus, out)] if versus else []
    if sweep.claims:
        extra += write_study_claims(sweep, runs, out)
    statistics = write_round_statistics(sweep, runs, out)
    extra += [statistics] if statistics else []
    if has_validation(runs):
        extra += [write_validation(sweep, runs, out),
                  *write_figures(sweep, collect(sweep, runs, validation=True), out, split="val")]
    return [md, csv_path, *extra, *write_figures(sweep, cells, out), *write_splits(sweep, cells, out)]
