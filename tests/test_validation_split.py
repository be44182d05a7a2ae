"""The validation split (config key ``val_fraction``): held out of each client's training samples, seeded and
stratified, never trained on, disjoint from the test split, and evaluated beside the test split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedpers.registry.config import build_config
from fedpers.core.errors import DataError
from fedpers.core.federation import get_federation
from fedpers.apps.inprocess import run_in_process
from fedpers.core.partition import Partition, hold_out_validation
from fedpers.core.results import read_metrics, read_summary
from fedpers.apps.report import write_validation
from fedpers.apps.sweep import MethodEntry, PlannedRun, Sweep

from tests.conftest import tiny_overrides


def _partition() -> tuple[Partition, np.ndarray]:
    """Four clients: 16 samples of 3 classes (10/5/1), 4 samples (3/1/0), 2 samples of one class, 1 sample."""
    labels = np.array([0] * 10 + [1] * 5 + [2] + [0] * 3 + [1] + [2] * 2 + [2])
    train = (np.arange(16), np.arange(16, 20), np.array([20, 21]), np.array([22]))
    return Partition(train, (np.arange(3),) * 4, np.zeros(0, np.int64)), labels


def test_per_class_counts_are_exact_and_every_index_is_either_held_out_or_trained_on():
    partition, labels = _partition()
    held = hold_out_validation(partition, labels, 0.2, np.random.default_rng(0))
    # client 0: class 0 has 10 -> 2, class 1 has 5 -> 1, class 2 has 1 -> 0 (round(0.2) = 0)
    assert np.bincount(labels[held.val[0]], minlength=3).tolist() == [2, 1, 0]
    # client 1: class 0 has 3 -> round(0.6) = 1, class 1 has 1 -> 0
    assert np.bincount(labels[held.val[1]], minlength=3).tolist() == [1, 0, 0]
    # client 2: two samples of class 2, round(0.4) = 0, so one sample is still held out (it has two)
    assert len(held.val[2]) == 1 and len(held.train[2]) == 1
    # client 3: one sample: nothing is held out, its only sample is trained on
    assert len(held.val[3]) == 0 and held.train[3].tolist() == [22]
    for k in range(4):
        assert np.intersect1d(held.val[k], held.train[k]).size == 0
        assert np.array_equal(np.union1d(held.val[k], held.train[k]), np.sort(partition.train[k]))
    assert held.test is partition.test and held.aux is partition.aux


def test_the_draw_is_seeded():
    partition, labels = _partition()
    a = hold_out_validation(partition, labels, 0.3, np.random.default_rng(5))
    b = hold_out_validation(partition, labels, 0.3, np.random.default_rng(5))
    c = hold_out_validation(partition, labels, 0.3, np.random.default_rng(6))
    assert all(np.array_equal(x, y) for x, y in zip(a.val, b.val))
    assert not np.array_equal(a.val[0], c.val[0])


def test_a_fraction_outside_the_open_unit_interval_is_refused():
    partition, labels = _partition()
    with pytest.raises(DataError, match="val_fraction"):
        hold_out_validation(partition, labels, 1.0, np.random.default_rng(0))
    with pytest.raises(Exception, match="val_fraction"):
        build_config({"val_fraction": 1.0})


@pytest.mark.parametrize("partition", ["dirichlet", "flwr"])
def test_held_out_samples_are_disjoint_from_what_the_client_trains_on_and_from_its_test_split(partition):
    keys = dict(num_clients=4, partition=partition, alpha=0.5, flwr_partitioner_args="{alpha: 0.5}")
    cfg = build_config(tiny_overrides(val_fraction=0.15, **keys))
    whole = get_federation(build_config(tiny_overrides(**keys)))
    fed = get_federation(cfg)
    p = fed.partition
    assert p.val is not None and len(p.val) == 4
    for k in range(4):
        assert len(p.val[k]) > 0
        assert np.intersect1d(p.val[k], p.train[k]).size == 0
        assert np.intersect1d(p.val[k], p.aux).size == 0
        # the client's split before hold-out is train + val exactly; its test split is unchanged
        assert np.array_equal(np.union1d(p.val[k], p.train[k]), np.sort(whole.partition.train[k]))
        assert np.array_equal(p.test[k], whole.partition.test[k])
        if p.index_space == "joined":  # one index space: test indices must not be held out or trained on
            assert np.intersect1d(p.val[k], p.test[k]).size == 0
        data = fed.client(k, __import__("torch").device("cpu"))
        assert len(data.val) == len(p.val[k]) and len(data.train) == len(p.train[k])
    counts = fed.client_label_counts()
    assert sum(sum(c["val"]) for c in counts.values()) == sum(map(len, p.val))


def test_a_run_records_validation_accuracy_beside_test_accuracy_and_trains_without_the_held_out_samples(tmp_path):
    cfg = build_config(tiny_overrides(method="pfedkdh", variant="ea", val_fraction=0.2, out_dir=str(tmp_path)))
    run_in_process(cfg)
    rounds = read_metrics(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert set(r["val_per_client_acc"]) == set(r["per_client_acc"]) == {"0", "1", "2"}
        assert r["val_personalized_macro_acc"] == pytest.approx(np.mean(list(r["val_per_client_acc"].values())))
        assert "val_personalized_macro_acc_fair" in r  # the Fair variant, on the validation split too
    summary = read_summary(tmp_path)
    fed = get_federation(cfg)
    assert summary["val_fraction"] == 0.2
    assert summary["client_val_sizes"] == [len(v) for v in fed.partition.val]
    assert summary["client_train_sizes"] == [len(t) for t in fed.partition.train]
    assert "val_personalized_macro_acc" in summary["final"]


def test_validation_metrics_are_those_of_the_model_whose_test_accuracy_is_reported():
    """FedBABU fine-tunes a copy of the model at evaluation: the validation accuracy is that of the very
    copy whose test accuracy is reported (the evaluation stream is seeded anew for the validation pass)."""
    import torch
    from flwr.common import EvaluateIns, ndarrays_to_parameters

    from fedpers.core import seeds
    from fedpers.algorithms.fedbabu import fine_tune_copy
    from fedpers.core.models import build_model, get_arrays
    from fedpers.registry.methods import client_for_message
    from fedpers.core.training import evaluate, seed_everything
    from tests.conftest import make_context

    cfg = build_config(tiny_overrides(method="fedbabu", val_fraction=0.25, fedbabu_finetune_epochs=2))
    fed = get_federation(cfg)
    model = build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, dropout=cfg.dropout,
                        seed=cfg.seed)
    ins = EvaluateIns(ndarrays_to_parameters(get_arrays(model, "backbone")), {"server_round": 1})
    reply = client_for_message(cfg, make_context(0, 3)).evaluate(ins).metrics

    data = fed.client(0, torch.device("cpu"))
    tuned = fine_tune_copy(model, data.train.x, data.train.y, epochs=2, lr=cfg.lr, batch_size=cfg.batch_size,
                           drop_last=cfg.drop_last_batch,
                           generator=seed_everything(cfg.seed, 1, 0, seeds.CLIENT_EVALUATE))
    assert reply["acc"] == evaluate(tuned, data.test.x, data.test.y)[0]
    assert reply["val_acc"] == evaluate(tuned, data.val.x, data.val.y)[0]
    assert reply["val_acc_initial"] == evaluate(model, data.val.x, data.val.y)[0]


def test_the_report_chooses_by_validation_accuracy_only(tmp_path):
    def run(name: str, val: list[float], test: list[float], **other_val: float) -> PlannedRun:
        d = tmp_path / name
        d.mkdir()
        rounds = [{"round": i + 1, "personalized_macro_acc": t, "val_personalized_macro_acc": v}
                  for i, (v, t) in enumerate(zip(val, test))]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
        extra = {f"val_personalized_macro_acc_{k}": v for k, v in other_val.items()}
        extra.update({f"personalized_macro_acc_{k}": 0.5 for k in other_val})
        (d / "summary.json").write_text(json.dumps({
            "metric": "personalized_macro_acc", "val_fraction": 0.15,
            "final": {"personalized_macro_acc": test[-1], "val_personalized_macro_acc": val[-1], **extra},
            "mean_last_5_evaluated": {"personalized_macro_acc": float(np.mean(test[-5:])),
                                      "val_personalized_macro_acc": float(np.mean(val[-5:])), **extra}}))
        return PlannedRun(name, "mnist", 0.05, 0, str(d), {})

    rows = [MethodEntry("a", "pfedkdh", {"lambda_kd": 0.1}), MethodEntry("b", "pfedkdh", {"lambda_kd": 0.5}),
            MethodEntry("FedPer", "fedper"),
            # one FedBABU run read at two fine-tuning lengths: one choice, because the study groups them
            MethodEntry("ft5", "fedbabu", {}, None, "FedBABU"),
            MethodEntry("ft1", "fedbabu", {}, "personalized_macro_acc_ft1", "FedBABU")]
    runs = [run(rows[0].run_key, [0.90] * 5, [0.99] * 5),  # best on test, worse on validation
            run(rows[1].run_key, [0.95] * 5, [0.90] * 5),
            run(rows[2].run_key, [0.80] * 5, [0.80] * 5),
            run(rows[3].run_key, [0.93] * 5, [0.97] * 5, ft1=0.96)]
    sweep = Sweep(rows, ["mnist"], [0.05], [0])
    text = write_validation(sweep, runs, tmp_path).read_text()
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert lines["b"].rstrip().endswith("| **chosen** |")
    assert "chosen" not in lines["a"] and "chosen" not in lines["FedPer"]  # FedPer: alone in its group
    assert "| 1 | 95.00 | 95.00 | 90.00 | 90.00 |" in lines["b"]
    assert lines["ft1"].rstrip().endswith("| **chosen** |") and "chosen" not in lines["ft5"]
