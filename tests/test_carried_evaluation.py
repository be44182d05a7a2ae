"""evaluate_with_next_fit: round t's evaluation of a client sampled again in round t + 1 travels with that fit
message. The numbers must be those of the two messages it replaces (tests/test_regression.py checks every
method's records against the recordings); here: the wire format, one client's replies, and a resume from a
checkpoint written while a round waited for its carried evaluations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.common import EvaluateIns, FitIns, ndarrays_to_parameters, parameters_to_ndarrays

from fedpers.core.checkpoint import load_checkpoint
from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.apps.inprocess import run_in_process
from fedpers.registry.methods import client_for_message, strategy_class_for
from fedpers.core.results import read_metrics
from fedpers.core.wire import (carried_evaluation_of, carried_metrics, evaluate_round_of, round_config,
                          server_round_of, with_evaluation)
from tests.conftest import tiny_overrides
from tests.regression_runs import VOLATILE_KEYS, VOLATILE_SUFFIX


def test_wire_carries_an_evaluate_reply_through_fit_metrics_unchanged():
    config = with_evaluation(round_config(4, jdfl_m=2), 3)
    assert server_round_of(config) == 4 and evaluate_round_of(config) == 3 and config["jdfl_m"] == 2
    assert evaluate_round_of(round_config(4)) is None
    reply = {"partition_id": 2, "acc": 0.75, "acc_global_head": 0.5, "state_digest": "ab12"}
    fit_metrics = {"train_loss": 0.25, "partition_id": 2, **carried_metrics(1.5, 40, reply)}
    assert carried_evaluation_of(fit_metrics) == (1.5, 40, reply)
    assert fit_metrics["train_loss"] == 0.25  # the fit's own metrics are untouched
    assert carried_evaluation_of({"train_loss": 0.25, "partition_id": 2}) is None


def _context(pid: int, cfg) -> Context:
    return Context(run_id=1, node_id=100 + pid, node_config={"partition-id": pid, "num-partitions": cfg.num_clients},
                   state=RecordDict(), run_config=cfg.to_dict())


@pytest.mark.parametrize("method", ["pfedkdh", "fedeagd", "ditto"])
def test_a_carried_evaluation_is_the_evaluate_message_it_replaces(method):
    """Evaluate then fit as two messages, and one fit message carrying the evaluation, from the same
    client state: the same evaluation, the same upload, the same fit metrics."""
    cfg = build_config(tiny_overrides(method=method, variant="ea"))
    strategy = strategy_class_for(cfg)(cfg, get_federation(cfg))
    broadcast = ndarrays_to_parameters(strategy.download_arrays())
    replies = {}
    for mode in ("two messages", "carried"):
        context = _context(1, cfg)
        client_for_message(cfg, context).fit(FitIns(broadcast, round_config(1)))  # state from round 1
        if mode == "two messages":
            evaluated = client_for_message(cfg, context).evaluate(EvaluateIns(broadcast, round_config(1)))
            fit = client_for_message(cfg, context).fit(FitIns(broadcast, round_config(2)))
            replies[mode] = (evaluated.loss, evaluated.num_examples, dict(evaluated.metrics)), fit
        else:
            fit = client_for_message(cfg, context).fit(FitIns(broadcast, with_evaluation(round_config(2), 1)))
            replies[mode] = carried_evaluation_of(fit.metrics), fit
    (evaluation, fit), (carried, carried_fit) = replies["two messages"], replies["carried"]
    assert carried == evaluation and evaluation[2]["acc"] > 0
    own = {k: v for k, v in carried_fit.metrics.items() if not k.startswith("evaluated:")}
    assert own == fit.metrics and carried_fit.num_examples == fit.num_examples
    got, expected = parameters_to_ndarrays(carried_fit.parameters), parameters_to_ndarrays(fit.parameters)
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


def _rounds(out) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE_KEYS and not k.endswith(VOLATILE_SUFFIX)}
            for r in read_metrics(out)]


@pytest.mark.parametrize("method", ["pfedkdh", "fedeagd"])
def test_resume_from_a_round_waiting_for_its_carried_evaluations(method, tmp_path):
    """A server stopped after round 1's evaluate phase (all of round 1's evaluations are to come with round
    2's fit replies) has a checkpoint of round 1 holding the pending round and no record yet; resumed, the
    run writes exactly the records of a run that was never stopped."""
    def cfg(name: str, **keys):
        return build_config(tiny_overrides(method=method, variant="ea", rounds=3, out_dir=str(tmp_path / name / "out"),
                                           checkpoint_dir=str(tmp_path / name / "ckpt"),
                                           client_state_dir=str(tmp_path / name / "state"), **keys))

    run_in_process(cfg("whole"))
    stopped = cfg("stopped")
    run_in_process(stopped, stop_after=1)
    checkpoint = load_checkpoint(stopped.checkpoint_dir)
    assert checkpoint["round"] == 1 and checkpoint["history"] == []
    pending = checkpoint["pending"]
    assert pending["round"] == 1 and pending["state"]["deferred"] == [0, 1, 2]  # fraction_fit 1: all carried
    assert pending["state"]["evaluations"] == [] and read_metrics(stopped.out_dir) == []
    run_in_process(stopped.replace(resume=True))
    whole, resumed = _rounds(cfg("whole").out_dir), _rounds(stopped.out_dir)
    assert [r["round"] for r in resumed] == [1, 2, 3] and resumed[0]["evaluated_clients"] == 3
    assert json.dumps(resumed) == json.dumps(whole)


@pytest.mark.parametrize("method", ["fedeagd", "jdfl-over-scaffold"])
def test_sparse_eval_rounds_and_partial_participation_give_the_numbers_of_evaluate_messages(method, tmp_path):
    """eval_every 2 over 5 rounds with 2 of 3 clients per round: the rounds without evaluation are written
    in order between the pending ones, the client not sampled next gets an evaluate message, and every
    record equals the one of a run with evaluate messages only, but for bytes_down."""
    keys = dict(method="fedeagd") if method == "fedeagd" else dict(
        method="scaffold", jdfl="graded", dataset="digits_domains", partition="domain", aux_size=0,
        model_kind="gn_cnn", feature_dim=32, jdfl_discovery_epochs=1)
    runs = {}
    for carry in (False, True):
        out = tmp_path / f"carry-{carry}"
        run_in_process(build_config(tiny_overrides(rounds=5, eval_every=2, fraction_fit=0.67, out_dir=str(out),
                                                   evaluate_with_next_fit=carry, **keys)))
        runs[carry] = _rounds(out)
    off, on = runs[False], runs[True]
    assert [r["round"] for r in on] == [1, 2, 3, 4, 5]
    assert [r["evaluated_clients"] for r in on] == [0, 3, 0, 3, 3]
    strip = lambda rounds: [{k: v for k, v in r.items() if k != "bytes_down"} for r in rounds]  # noqa: E731
    assert json.dumps(strip(on)) == json.dumps(strip(off))
    saved = [a["bytes_down"] - b["bytes_down"] for a, b in zip(off, on)]
    assert saved[0] == saved[2] == saved[4] == 0 and saved[1] > 0 and saved[3] == saved[1]  # rounds 2 and 4 carried
