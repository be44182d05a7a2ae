"""Sweeps (plan, validation, resume) and the paper-style report (table, figures), plus TensorBoard."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedpers.registry.config import build_config
from fedpers.core.errors import ConfigError
from fedpers.apps.report import paired_client_difference, report
from fedpers.core.results import ResultsWriter, accuracy_summary
from fedpers.apps.sweep import load_sweep, plan, recorded_differences, run_sweep, write_plan
from tests.conftest import ROOT

SWEEP = """
base: {rounds: 2, num_clients: 3, aux_size: 50, feature_dim: 16, local_epochs: 1, fraction_fit: 1.0}
datasets: [digits]
alphas: [0.5, 1.0]
seeds: [0, 1]
methods:
  - fedavg
  - {label: pFedKDH-Fair, method: pfedkdh, set: {variant: ea}, metric: personalized_macro_acc_fair}
  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}
ablation: true
"""


def fake_run(run, accs, per_client=None, label_counts=None):
    """Write the files a finished run leaves, with given per-round accuracies (fractions) and, optionally,
    per-round per-client accuracies and the clients' label counts."""
    writer = ResultsWriter(run.run_dir)
    history = [{"round": r, "global_acc": acc - 0.1, "personalized_macro_acc": acc,
                "personalized_macro_acc_fair": acc - 0.05,
                "per_client_acc": per_client[r - 1] if per_client else {}, "train_loss": 1.0,
                "bytes_up": 1, "bytes_down": 1, "round_seconds": 1.0} for r, acc in enumerate(accs, 1)]
    for record in history:
        writer.append_round(record)
    method = run.overrides["method"]
    metric = "global_acc" if method == "fedavg" else "personalized_macro_acc"
    writer.write_summary({"metric": metric, "final": {"global_acc": accs[-1] - 0.1,
                                                      "personalized_macro_acc": accs[-1],
                                                      "personalized_macro_acc_fair": accs[-1] - 0.05},
                          **accuracy_summary(history),
                          "aux_size": run.overrides.get("aux_size", 50),
                          **({} if label_counts is False else {"client_label_counts": label_counts or {
                              "0": {"train": [3, 1]}, "1": {"train": [0, 4]}}})})


def planned_sweep(tmp_path, text, out):
    """Write sweep ``text`` to a file, write its plan to ``out`` and return its planned runs."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    sweep = load_sweep(path)
    write_plan(sweep, out)
    return plan(sweep, out)


def test_plan_dedupes_rows_sharing_runs_and_validates(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    sweep = load_sweep(path)
    runs = plan(sweep, tmp_path / "out")
    assert len(runs) == 2 * 2 * 2  # fedavg + one shared pfedkdh run, x 2 alphas x 2 seeds
    assert len({r.run_dir for r in runs}) == len(runs)
    # a whole column first: both methods of the first seed and alpha, then the next alpha
    assert [(r.seed, r.alpha) for r in runs[:2]] == [(runs[0].seed, runs[0].alpha)] * 2
    assert runs[0].run_key != runs[1].run_key and runs[2].alpha != runs[0].alpha
    bad = tmp_path / "bad.yaml"
    bad.write_text(SWEEP.replace("local_epochs: 1", "local_epoch: 1"))
    with pytest.raises(ConfigError, match="unknown config key 'local_epoch'"):
        load_sweep(bad)
    bad.write_text(SWEEP.replace("seeds: [0, 1]\n", ""))
    with pytest.raises(ConfigError, match="missing 'seeds'"):
        load_sweep(bad)


def test_report_table_and_figures(tmp_path):
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, SWEEP, out):
        base = 0.9 if run.overrides["method"] == "pfedkdh" else 0.8
        if run.alpha == 1.0 and run.seed == 1 and run.overrides["method"] == "fedavg":
            continue  # an unfinished run is left out, not counted as zero
        fake_run(run, [base - 0.2, base + 0.01 * run.seed])
    files = report(out)
    table = (out / "table.md").read_text()
    # pFedKDH-EA: seeds give 90 and 91 -> 90.50 ± 0.71 (sample SD), best -> bold where every row finished the same
    # seeds (alpha 0.5); Fair reads its own metric (-5) (the cells differ in their finished seeds, so each
    # names its n)
    assert "| pFedKDH-EA | **90.50±0.71 (n=2)** | 90.50±0.71 (n=2) |" in table
    assert "| pFedKDH-Fair | 85.50±0.71 (n=2) |" in table
    # fedavg's metric is global accuracy (acc - 10); alpha=1.0 has only seed 0
    assert "| fedavg | 70.50±0.71 (n=2) | 70.00 (n=1) |" in table
    # alpha=1's rows finished different seeds: its best mean is not bold, its best per seed is
    assert "| pFedKDH-EA | seed 0: **90.00**, seed 1: **91.00** | seed 0: **90.00**, seed 1: **91.00** |" in table
    assert "| fedavg | seed 0: 70.00, seed 1: 71.00 | seed 0: 70.00 |" in table
    csv_text = (out / "table.csv").read_text()
    assert "digits_a0.5_mean" in csv_text and ",1\n" in csv_text
    names = {p.name for p in files}
    assert {"curves_digits_a0.5.png", "curves_digits_a1.png", "ablation_digits_a0.5.png"} <= names
    assert all(p.stat().st_size > 1000 for p in files if p.suffix == ".png")


def test_report_best_value_one_metric_for_all_rows_paper_columns_and_splits(tmp_path):
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, SWEEP.replace("ablation: true", "paper:\n  fedavg: {digits_a0.5: 75.0}"), out):
        fake_run(run, [0.9, 0.95, 0.7])  # best evaluated round: 2
    report(out, value="best")
    table = (out / "table.md").read_text()
    assert "| method | digits α=0.5 | paper | diff | digits α=1 |" in table
    assert "| fedavg | 85.00±0.00 (n=2) | 75.00 | +10.00 | 85.00±0.00 (n=2) |" in table  # its global accuracy in round 2
    assert "| pFedKDH-EA | **95.00±0.00 (n=2)** | – |  | **95.00±0.00 (n=2)** |" in table  # no paper value for this row
    assert "| pFedKDH-Fair | 90.00±0.00 (n=2) |" in table
    assert "Best-evaluated-round accuracy" in table
    report(out, metric="personalized_macro_acc")  # one metric for every row, final round
    table = (out / "table.md").read_text()
    assert "| fedavg | **70.00±0.00 (n=2)** | 75.00 | -5.00 |" in table and "every row: personalized_macro_acc" in table
    assert (out / "split_digits_a0.5_seed0.png").is_file() and (out / "split_digits_a1_seed1.png").is_file()
    with pytest.raises(ConfigError, match="value must be one of"):
        report(out, value="max")


def test_a_studys_report_entry_is_how_report_reads_it_unless_told(tmp_path):
    """``report: {value: best}`` in the sweep file: ``fedpers report DIR`` alone reads the best round, an explicit
    value still wins, and the last-5 table sits beside the headline one."""
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, SWEEP + "report: {value: best, versus: [fedavg]}\n", out):
        fake_run(run, [0.9, 0.95, 0.7])
    report(out)
    table = (out / "table.md").read_text()
    assert "Best-evaluated-round accuracy" in table and (out / "versus.md").is_file()
    assert "Mean of the last 5 evaluated rounds' accuracy (mean ± sample SD over seeds, n)" in table
    report(out, value="final")
    assert "Final-round accuracy" in (out / "table.md").read_text()
    for bad, words in (("{value: max}", "report: 'value' must be one of final, best, last5"),
                       ("{versus: [nobody]}", "report: versus ['nobody'] is not a row of the study"),
                       ("{colour: red}", "report: unknown entries ['colour']"),
                       ("[best]", "'report' is a mapping")):
        path = tmp_path / "bad.yaml"
        path.write_text(SWEEP + f"report: {bad}\n")
        with pytest.raises(ConfigError, match="report") as info:
            load_sweep(path)
        assert words in str(info.value) and "\n" not in str(info.value)


def test_ready_sweep_files_are_valid():
    files = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))
    assert files
    for f in files:
        load_sweep(f)


def test_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = ResultsWriter(tmp_path, tensorboard=True)
    for r in (1, 2):
        writer.append_round({"round": r, "global_acc": 0.5 * r, "personalized_macro_acc": None,
                             "per_client_acc": None, "train_loss": 1.0 / r, "bytes_up": 10, "bytes_down": 20,
                             "round_seconds": 0.1})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("global_acc")] == [0.5, 1.0]
    assert "personalized_macro_acc" not in acc.Tags()["scalars"]


@pytest.mark.simulation
def test_real_sweep_runs_and_resumes(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("base: {rounds: 1, num_clients: 3, aux_size: 50, feature_dim: 16, local_epochs: 1, "
                    "fraction_fit: 1.0, device: cpu}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\n"
                    "methods: [fedavg]\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedpers", "sweep", str(path), "--out", str(out)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 to run" in first.stdout and (out / "table.md").exists()
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "1 already done, 0 to run" in second.stdout


@pytest.mark.simulation
def test_two_jobs_give_the_same_tables_as_one(tmp_path):
    """fedpers sweep --jobs 2 runs two runs at once (sharing the CPUs here) and gives the same tables (on the
    in-process engine: what --jobs does is the same for both engines, and Ray's start-up would be most of the time)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 2, num_clients: 3, fraction_fit: 1.0, local_epochs: 1, aux_size: 100, "
                     "feature_dim: 64, device: cpu, batch_size: 32, lr: 0.05}\ndatasets: [digits]\n"
                     "alphas: [1.0]\nseeds: [0]\nmethods: [fedavg, fedper]\n")
    tables = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        proc = subprocess.run([sys.executable, "-m", "fedpers", "sweep", str(sweep), "--out", str(out),
                               "--jobs", str(jobs), "--engine", "inprocess"], capture_output=True, text=True, cwd=ROOT,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        tables[jobs] = ((out / "table.md").read_text(), (out / "table.csv").read_text())
    assert "2 at a time" in proc.stdout
    assert tables[1] == tables[2] and "| fedper |" in tables[1][0]


def test_paired_client_difference_exact_values():
    ours = {"0": 0.90, "1": 0.80, "2": 1.00, "3": 0.50}
    reference = {"0": 0.85, "1": 0.80, "2": 0.90, "3": 0.55, "9": 0.1}  # client 9: only in one run, left out
    result = paired_client_difference(ours, reference)
    # differences in points: +5, 0, +10, -5 -> mean 2.5; sample std sqrt(((2.5)^2+(2.5)^2+(7.5)^2+(7.5)^2)/3)
    assert result["clients"] == 4 and result["diff"] == pytest.approx(2.5)
    assert result["se"] == pytest.approx(np.sqrt((2 * 2.5**2 + 2 * 7.5**2) / 3) / 2)
    assert (result["higher"], result["lower"], result["equal"]) == (2, 1, 1)
    assert paired_client_difference({"0": 1.0}, {"1": 1.0}) == {"clients": 0}


def test_report_versus_pairs_clients_of_the_same_split(tmp_path):
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, SWEEP, out):
        if run.overrides["method"] == "fedavg":  # per-client 0.8 / 0.6 every round
            fake_run(run, [0.7] * 6, [{"0": 0.8, "1": 0.6}] * 6)
        else:  # client 0 gains 10 points in the last round only, client 1 is 5 points lower throughout
            fake_run(run, [0.675] * 5 + [0.725], [{"0": 0.8, "1": 0.55}] * 5 + [{"0": 0.9, "1": 0.55}])
    report(out, versus="fedavg")
    versus = (out / "versus.md").read_text()
    # last round: +10 and -5 -> +2.50 ± 7.50 (std 10.61 / sqrt 2); last 5 rounds (2-6): +2 and -5 -> -1.50 ± 3.50
    assert "| pFedKDH-EA | digits α=0.5 | 0 | 2 | 6 | +2.50 | 7.50 | 1/1/0 | 2-6 | -1.50 | 3.50 | 1/1/0 |" in versus
    assert versus.count("| pFedKDH-EA |") == 4 + 2  # 2 alphas x 2 seeds, then one pooled line per alpha
    assert "| pFedKDH-Fair |" not in versus  # reads another metric of EA's run: no per-client values of its own
    # pooled over seeds 0 and 1 at the final round: +10, -5, +10, -5 -> mean +2.50, SE 8.66 / 2 = 4.33,
    # t(0.975, 3) = 3.182 -> +2.50 ± 13.78
    # and each seed's own difference of the macro means: +2.50 in both
    assert ("| pFedKDH-EA | digits α=0.5 | 0, 1 | 4 client pairs | +2.50 | -11.28 to +16.28 | 2/2 | +2.50, +2.50 |"
            in versus)
    with pytest.raises(ConfigError, match="--versus 'FedAvg' is not a row of the sweep"):
        report(out, versus="FedAvg")
    with pytest.raises(ConfigError, match="'pFedKDH-Fair' reads metric 'personalized_macro_acc_fair'"):
        report(out, versus="pFedKDH-Fair")


def test_report_versus_does_not_pair_runs_on_another_split(tmp_path):
    """A row that removes a server set from the clients (aux_size) or whose clients hold other label counts
    is listed as not paired, and its split gets its own figure."""
    text = SWEEP.replace("alphas: [0.5, 1.0]", "alphas: [0.5]").replace("seeds: [0, 1]", "seeds: [0]").replace(
        "  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}",
        "  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}\n"
        "  - {label: FedPer more Ds, method: fedper, set: {aux_size: 80}}\n"
        "  - {label: FedPer other counts, method: fedper, set: {lr: 0.5}}\n"
        "  - {label: FedPer no counts, method: fedper, set: {lr: 0.7}}")
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, text, out):
        aux, lr = run.overrides.get("aux_size", 50), run.overrides.get("lr")
        counts = {"0": {"train": [3, 1]}, "1": {"train": [0, 4]}}
        if aux == 80 or lr == 0.5:
            counts = {"0": {"train": [2, 1]}, "1": {"train": [0, 4]}}
        if lr == 0.7:  # a summary written before the counts were recorded: nothing tells the splits apart
            counts = False
        fake_run(run, [0.7] * 2, [{"0": 0.8, "1": 0.6}] * 2, label_counts=counts)
    report(out, versus="fedavg")
    versus = (out / "versus.md").read_text()
    assert "| FedPer more Ds | digits α=0.5 | 0 | – | – | not paired: another split (aux_size 80 vs 50) |" in versus
    assert ("| FedPer other counts | digits α=0.5 | 0 | – | – | not paired: another split (the clients' label "
            "counts differ) |") in versus
    assert "| pFedKDH-EA | digits α=0.5 | 0 | 2 | 2 | +0.00 | 0.00 | 0/0/2 |" in versus
    assert "| FedPer no counts | digits α=0.5 | 0 | 2 | 2 | +0.00 | 0.00 | 0/0/2 |" in versus
    figures = sorted(p.name for p in out.glob("split_*.png"))
    assert figures == ["split_digits_a0.5_seed0.png", "split_digits_a0.5_seed0_fedper_aux_size=80.png"]


def test_report_finds_the_runs_of_a_sweep_directory_moved_elsewhere(tmp_path):
    """sweep.json names the run directories where the sweep ran; a copied or moved sweep directory (as the
    committed studies are) reports its own copies of the runs, not the originals (gone here)."""
    import shutil

    ran_in = tmp_path / "ran_in"
    for run in planned_sweep(tmp_path, SWEEP, ran_in):
        fake_run(run, [0.5, 0.9 if run.overrides["method"] == "fedavg" else 0.6])
    moved = tmp_path / "results" / "study"
    shutil.copytree(ran_in, moved)
    shutil.rmtree(ran_in)
    report(moved)
    table = (moved / "table.md").read_text()
    assert "| fedavg | **80.00±0.00 (n=2)** | **80.00±0.00 (n=2)** |" in table  # global_acc = accuracy - 0.1
    assert "| pFedKDH-EA | 60.00±0.00 (n=2) | 60.00±0.00 (n=2) |" in table


TABLE = """\
base: {rounds: 50, local_epochs: 2, lr: 0.015}
datasets: [digits]
alphas: [0.05, 0.5]
seeds: [0, 1, 2]
methods:
  - {label: FedAvg, method: fedavg}
  - {label: FedPer, method: fedper}
  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}
paper:
  FedAvg: {digits_a0.05: 90.0, digits_a0.5: 95.0}
  FedPer: {digits_a0.05: 97.0}
  pFedKDH-EA: {digits_a0.05: 98.0}
claims:
  - {id: ea-first-a0.05, column: digits_a0.05, order: [pFedKDH-EA, FedPer]}
  - {id: ea-first-a0.5, column: digits_a0.5, order: [pFedKDH-EA, FedPer]}
  - {id: fedavg-close, column: digits_a0.05, within: {rows: [FedAvg], tolerance: 1.5}}
"""


def test_a_study_extends_the_one_declaration_of_a_table(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "table.yaml").write_text(TABLE)
    study = tmp_path / "study.yaml"
    study.write_text("extends: tables/table.yaml\n"
                     "rows: {FedPer: FedPer, EA (defaults): pFedKDH-EA}\n"
                     "base: {eval_every: 5, rounds: 3}\n"
                     "alphas: [0.05]\nseeds: [0]\n"
                     "methods: [{label: EA (T=1), method: pfedkdh, set: {variant: ea, temperature: 1}}]\n"
                     "paper: {EA (T=1): {digits_a0.05: 98.0}}\n"
                     "claims: [{id: own, order: [EA (T=1), FedPer]}]\n")
    sweep = load_sweep(study)
    assert [(m.label, m.method, m.set) for m in sweep.methods] == [
        ("FedPer", "fedper", {}), ("EA (defaults)", "pfedkdh", {"variant": "ea"}),
        ("EA (T=1)", "pfedkdh", {"variant": "ea", "temperature": 1})]
    assert sweep.base == {"rounds": 3, "local_epochs": 2, "lr": 0.015, "eval_every": 5}
    assert (sweep.datasets, sweep.alphas, sweep.seeds) == (["digits"], [0.05], [0])
    assert sweep.paper == {"FedPer": {"digits_a0.05": 97.0}, "EA (defaults)": {"digits_a0.05": 98.0},
                           "EA (T=1)": {"digits_a0.05": 98.0}}
    # the declared claims of its column whose rows it runs (renamed), then its own
    assert [(c["id"], c.get("order")) for c in sweep.claims] == [
        ("ea-first-a0.05", ["EA (defaults)", "FedPer"]), ("own", ["EA (T=1)", "FedPer"])]
    # the rows run what the declaration's rows run: the same run directories
    assert {r.run_key for r in plan(sweep, tmp_path / "out")} == {"fedper", "pfedkdh_variant=ea",
                                                                   "pfedkdh_temperature=1_variant=ea"}


def test_rows_with_their_own_seeds_are_planned_reported_with_n_and_replaced_by_a_plan_file(tmp_path):
    """A study gives two rows three seeds and the rest one: only those rows run seeds 1 and 2, the table
    names each cell's finished seeds (a one-seed row is not read as a mean of three), the plan survives
    sweep.json, and a plan file extending the study runs its own seeds for the rows it chooses."""
    text = SWEEP.replace("seeds: [0, 1]", "seeds: [0]").replace("alphas: [0.5, 1.0]", "alphas: [0.5]").replace(
        "  - fedavg\n", "  - {label: fedavg, method: fedavg, seeds: [0, 1, 2]}\n").replace(
        "  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}}",
        "  - {label: pFedKDH-EA, method: pfedkdh, set: {variant: ea}, seeds: [0, 2]}")
    out = tmp_path / "out"
    runs = planned_sweep(tmp_path, text, out)
    # seed 0 of both runs, then seed 1 of fedavg alone, then seed 2 of both (EA and Fair share their run)
    assert [(r.seed, r.run_key) for r in runs] == [(0, "fedavg"), (0, "pfedkdh_variant=ea"), (1, "fedavg"),
                                                    (2, "fedavg"), (2, "pfedkdh_variant=ea")]
    for run in runs:
        fake_run(run, [0.5, (0.9 if run.overrides["method"] == "pfedkdh" else 0.8) + 0.01 * run.seed])
    report(out)
    table = (out / "table.md").read_text()
    assert "| fedavg | 71.00±1.00 (n=3) |" in table  # global accuracy: 70, 71, 72
    assert "| pFedKDH-EA | 91.00±1.41 (n=2) |" in table and "| pFedKDH-Fair | 86.00±1.41 (n=2) |" in table
    assert "mean ± sample SD (ddof 1) over seeds 0 (fedavg: 0, 1, 2; pFedKDH-EA: 0, 2) with n (finished runs only)" in table
    # each seed's value beside the others', so that a seed is compared with the same seed
    # means over different seeds are of different splits: no mean is bold, each seed's best is
    assert "| fedavg | seed 0: 70.00, seed 1: **71.00**, seed 2: 72.00 |" in table
    assert "| pFedKDH-EA | seed 0: **90.00**, seed 2: **92.00** |" in table
    assert "best mean in bold only in a column whose rows finished the same seeds" in table
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("extends: s.yaml\nrows: [fedavg, pFedKDH-EA]\nseeds: [3]\n")
    assert {(r.seed, r.run_key) for r in plan(load_sweep(plan_file), out)} == {(3, "fedavg"),
                                                                             (3, "pfedkdh_variant=ea")}
    (tmp_path / "s.yaml").write_text(text.replace("seeds: [0, 2]", "seeds: [0, two]"))
    with pytest.raises(ConfigError, match=re.escape("row pFedKDH-EA: 'seeds' must list integers, got 'two'")):
        load_sweep(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(text.replace("seeds: [0, 2]", "seeds: []"))
    with pytest.raises(ConfigError, match=re.escape("row pFedKDH-EA: 'seeds' is empty")):
        load_sweep(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(text.replace("seeds: [0, 2]", "seed: 2"))
    with pytest.raises(ConfigError, match=re.escape("row pFedKDH-EA: unknown entries ['seed']")):
        load_sweep(tmp_path / "s.yaml")


@pytest.mark.parametrize("body, message", [
    ("extends: tables/table.yaml\nrows: [FedPer, FedRep]\n", "'rows' names ['FedRep'], not rows of table.yaml"),
    ("extends: study.yaml\n", "'extends' makes a loop"),
    ("rows: [FedPer]\n" + TABLE, "'rows' chooses rows of the file named by 'extends', and there is none"),
    ("extends: tables/missing.yaml\n", "not found"),
    ("extends: tables/table.yaml\nrows: 3\n", "'rows' lists labels of table.yaml or maps a label to one"),
])
def test_a_bad_extends_is_one_line(tmp_path, body, message):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "table.yaml").write_text(TABLE)
    (tmp_path / "study.yaml").write_text(body)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_sweep(tmp_path / "study.yaml")


def test_the_committed_studies_read_their_tables_declaration():
    for table, name in (("pfedkdh_table2", "pfedkdh_table2_mnist"), ("pfedkdh_table2", "pfedkdh_mnist_seeds"),
                        ("pfedkdh_table3_cifar10", "pfedkdh_cifar10_seeds")):
        declared_paper = load_sweep(ROOT / "configs" / "sweeps" / f"{table}.yaml").paper
        study = load_sweep(ROOT / "benchmarks" / "studies" / f"{name}.yaml")
        for label, cells in study.paper.items():
            declared = label.split(" (")[0]  # "pFedKDH-EA (λ=0.5 T=3 10 steps)": the table's pFedKDH-EA
            assert cells and all(declared_paper[declared][column] == value for column, value in cells.items())


def test_report_tabulates_the_round_statistics_a_run_names(tmp_path):
    """FedEAGD's records carry its drift statistics every round and summary.json names them: the report's
    round_statistics.md gives each at the chosen rounds, min and max over rounds, mean over seeds (exact);
    runs that name none (here FedAvg) get no row, and a sweep with none writes no file."""
    text = SWEEP.replace("alphas: [0.5, 1.0]", "alphas: [0.5]").replace(
        "  - {label: pFedKDH-Fair", "  - {label: FedEAGD, method: fedeagd}\n  - {label: pFedKDH-Fair")
    out = tmp_path / "out"
    runs = planned_sweep(tmp_path, text, out)
    for run in runs:
        fake_run(run, [0.5] * 4)
        if run.overrides["method"] != "fedeagd":
            continue
        records = [json.loads(line) for line in (tmp_path / run.run_dir / "metrics.jsonl").read_text().splitlines()]
        path = tmp_path / run.run_dir / "metrics.jsonl"
        path.write_text("".join(json.dumps({**r, "fedeagd_mean_drift": None if r["round"] == 1 else
                                            0.01 * r["round"] + 0.1 * run.seed, "fedeagd_mean_kd_coef": 0.5}) + "\n"
                                for r in records))
        summary_path = tmp_path / run.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, "round_statistics": ["fedeagd_mean_drift", "fedeagd_mean_kd_coef"]}))
    files = report(out)
    assert out / "round_statistics.md" in files
    table = (out / "round_statistics.md").read_text()
    # rounds 1, 2 and the last (4; a tenth and a quarter of 4 round to 0 and 1); seeds 0 and 1 differ by 0.1
    assert "| row | statistic | n | round 1 | round 2 | round 4 | min | max |" in table
    assert "| FedEAGD | fedeagd_mean_drift | 2 |  | 0.0700 | 0.0900 | 0.0700 | 0.0900 |" in table
    assert "| FedEAGD | fedeagd_mean_kd_coef | 2 | 0.5000 | 0.5000 | 0.5000 | 0.5000 | 0.5000 |" in table
    assert "fedavg" not in table and "pFedKDH" not in table
    plain = tmp_path / "plain"
    for run in planned_sweep(tmp_path, SWEEP, plain):
        fake_run(run, [0.5, 0.6])
    assert not (plain / "round_statistics.md").exists() and report(plain) and not (plain / "round_statistics.md").exists()


def _record_config(run, **changes):
    """Give a fake run's summary.json the config a real run records: its plan's, with ``changes``."""
    path = Path(run.run_dir) / "summary.json"
    config = {**build_config(run.overrides).to_dict(), **changes}
    path.write_text(json.dumps({**json.loads(path.read_text()), "config": config}))


def test_a_finished_run_made_with_other_values_than_its_plan_is_refused_by_sweep_and_report(tmp_path):
    """A default that changed after a run (here the runs recorded lambda_kd 0.5, the plan today gives 0.1):
    the sweep would skip the run and the report show it as the row it is not; both refuse, naming the run
    and the key, before anything is written. Another method's keys (ditto_lambda, pFedKDH's on FedAvg) and
    the run mechanics (out_dir, data_dir) are not compared. Pinning the value in base makes them the plan."""
    text = SWEEP.replace("alphas: [0.5, 1.0]", "alphas: [0.5]").replace("seeds: [0, 1]", "seeds: [0]")
    out = tmp_path / "out"
    for run in planned_sweep(tmp_path, text, out):
        fake_run(run, [0.5, 0.6])
        _record_config(run, lambda_kd=0.5, ditto_lambda=7.0, out_dir="/elsewhere", data_dir="/data")
    plan_file = (out / "sweep.json").read_text()
    refusal = re.escape(f"{out}/runs/pfedkdh_variant=ea/digits_a0.5/seed0/summary.json was made with lambda_kd "
                        "0.5 (plan: 0.1); pin the values it was made with")
    with pytest.raises(ConfigError, match="report: " + refusal):
        report(out)
    with pytest.raises(ConfigError, match="sweep: " + refusal):
        run_sweep(load_sweep(tmp_path / "s.yaml"), out)
    assert (out / "sweep.json").read_text() == plan_file and not (out / "table.md").exists()
    pinned = text.replace("fraction_fit: 1.0}", "fraction_fit: 1.0, lambda_kd: 0.5}")
    assert [r.run_dir for r in planned_sweep(tmp_path, pinned, out)] == [r.run_dir for r in plan(load_sweep(tmp_path / "s.yaml"), out)]
    assert run_sweep(load_sweep(tmp_path / "s.yaml"), out) == []  # every run finished: nothing to run
    assert out / "table.md" in report(out)
    # a plan written before a key was renamed: one line naming the run, not a traceback
    plan_json = json.loads((out / "sweep.json").read_text())
    plan_json["runs"][0]["overrides"]["recal_epoch"] = 3
    (out / "sweep.json").write_text(json.dumps(plan_json))
    with pytest.raises(ConfigError, match=r"report: the plan of .*/seed0 is not a valid config today \(unknown "
                                          r"config key 'recal_epoch' \(did you mean 'recal_epochs'\?\)\)"):
        report(out)


def test_recorded_differences_reads_a_key_not_recorded_as_its_default(tmp_path):
    """A key added to the schema after a run is not in its summary: the run had what the default gives, so
    it differs only where the plan moves the key off its default."""
    run = planned_sweep(tmp_path, SWEEP, tmp_path / "out")[0]
    recorded = build_config(run.overrides).to_dict()
    del recorded["val_fraction"]
    assert recorded_differences(run, recorded) == {}
    moved = replace(run, overrides={**run.overrides, "val_fraction": 0.15})
    assert recorded_differences(moved, recorded) == {"val_fraction": ("not recorded", 0.15)}
    assert recorded_differences(run, {**recorded, "local_epochs": 2}) == {"local_epochs": (2, 1)}


LIST_ROW = """
base: {rounds: 2, num_clients: 3, aux_size: 50, feature_dim: 16, local_epochs: 1, fraction_fit: 1.0}
datasets: [digits]
alphas: [0.5]
seeds: [0]
methods:
  - fedavg
  - {label: FedBABU, method: fedbabu, set: {fedbabu_finetune_also: "1,2,10", eval_every: 1}}
"""


@pytest.mark.parametrize("value, part", [("1,2,10", "1+2+10"), ("50,1ep", "50+1ep"), (0.005, "0.005"),
                                         (False, "False"), ("se_cnn", "se_cnn"), ("1+2", "1@2b2"),
                                         ("a/b", "a@2fb"), ("a-b", "a-b"), ("x y,#%", "x@20y+@23@25"),
                                         ("λ=1", "@ce@bb@3d1")])
def test_a_value_is_named_readably_and_reversibly(value, part):
    """A list's commas become +, a + of the value itself (or any character but A-Z a-z 0-9 . _ -) is
    escaped, so a list never reads as a scalar and two values never share a directory."""
    from fedpers.apps.sweep import name_part, value_of_name_part

    assert name_part(value) == part
    assert value_of_name_part(part) == str(value)


def test_run_dir_names_hold_only_characters_every_tool_carries(tmp_path):
    """No comma (Flower's bundle manifest splits at it), space, quote, %, #, ~ or / in a run directory's
    name; the list value of a row reads back from its name."""
    from hypothesis import given, settings, strategies as st

    from fedpers.apps.sweep import name_part, value_of_name_part

    runs = planned_sweep(tmp_path, LIST_ROW.replace("[digits]", "[\"../data/my,set.npz\"]"), tmp_path / "out")
    babu = next(r for r in runs if r.overrides["method"] == "fedbabu")
    assert babu.run_key == "fedbabu_eval_every=1_fedbabu_finetune_also=1+2+10"
    assert Path(babu.run_dir).relative_to(tmp_path / "out").parts == ("runs", babu.run_key, "my+set_a0.5", "seed0")
    assert value_of_name_part(babu.run_key.rsplit("=", 1)[1]) == "1,2,10"

    @settings(max_examples=300, deadline=None)
    @given(st.text())
    def round_trip(text):
        part = name_part(text)
        assert re.fullmatch(r"[A-Za-z0-9._+@-]*", part)
        assert value_of_name_part(part) == text

    round_trip()


def test_a_sweep_finds_its_finished_runs_under_the_new_names_and_moves_the_old_ones(tmp_path, capsys):
    """A finished run under its name is skipped; one an older sweep left under its former name (commas as
    written) is moved to the new name, then skipped, nothing run again or lost; a report of a sweep.json
    written before the renaming finds the runs under either name."""
    from fedpers.apps.sweep import read_plan

    out = tmp_path / "out"
    runs = planned_sweep(tmp_path, LIST_ROW, out)
    fedavg, babu = sorted(runs, key=lambda r: r.overrides["method"] != "fedavg")
    fake_run(fedavg, [0.5, 0.9])
    legacy = out / "runs" / "fedbabu_eval_every=1_fedbabu_finetune_also=1,2,10" / "digits_a0.5" / "seed0"
    fake_run(replace(babu, run_dir=str(legacy)), [0.5, 0.7])
    old_plan = json.loads((out / "sweep.json").read_text())  # as a sweep before the renaming wrote it
    for r in old_plan["runs"]:
        r["run_key"] = r["run_key"].replace("1+2+10", "1,2,10")
    (out / "sweep.json").write_text(json.dumps(old_plan))
    assert read_plan(out)[1][1].run_dir == str(legacy)  # an old plan of runs not moved yet: found there
    report(out)
    assert "| FedBABU | 70.00 (n=1) |" in (out / "table.md").read_text()

    assert run_sweep(load_sweep(tmp_path / "s.yaml"), out) == []
    printed = capsys.readouterr().out
    assert (f"sweep | renamed {legacy.relative_to(out)} -> {Path(babu.run_dir).relative_to(out)}" in printed
            and "2 runs, 2 already done, 0 to run" in printed)
    assert not legacy.parent.parent.exists() and (Path(babu.run_dir) / "summary.json").is_file()
    assert read_plan(out)[1][1].run_dir == babu.run_dir
    report(out)
    assert "| FedBABU | 70.00 (n=1) |" in (out / "table.md").read_text()
    assert not [p for p in out.rglob("*") if "," in p.name]


def test_report_refuses_odd_run_files_in_one_line_before_writing(tmp_path):
    """A summary.json that is a folder, a final value of NaN and a --value the runs never recorded are each
    one line naming the file; a folder the report cannot write in too (nothing is written first)."""
    from fedpers.apps.report import check_writable

    out = tmp_path / "out"
    runs = planned_sweep(tmp_path, SWEEP, out)
    for run in runs:
        fake_run(run, [0.5, 0.6])
    summary = Path(runs[0].run_dir) / "summary.json"
    saved = summary.read_text()
    summary.unlink()
    summary.mkdir()
    with pytest.raises(ConfigError, match=f"report: {summary} cannot be read"):
        report(out)
    summary.rmdir()
    summary.write_text(saved.replace('"personalized_macro_acc": 0.6', '"personalized_macro_acc": NaN', 1))
    with pytest.raises(ConfigError, match="final personalized_macro_acc is not a number \\(NaN or Inf"):
        report(out)
    data = json.loads(saved)
    data.pop("best")
    summary.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="records no 'best' values .*report another --value"):
        report(out, value="best")
    assert not (out / "table.md").exists()  # every refusal came before any file
    with pytest.raises(ConfigError, match="report: /proc cannot be written"):
        check_writable(Path("/proc"))
