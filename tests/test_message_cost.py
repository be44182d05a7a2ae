"""What a deployed message pays (issue 17): the ClientApp's imports, the digits cache, the reply polling."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT


def test_clientapp_imports_no_server_side_modules():
    code = ("import sys, fedpers.client_app; print(sorted(m for m in ('sklearn', 'scipy', 'pandas', 'matplotlib', "
            "'ray', 'strategies', 'fedpers.results', 'fedpers.run_figures', 'fedpers.app') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_pyproject_names_the_light_clientapp():
    import tomllib

    components = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "fedpers.app:server_app", "clientapp": "fedpers.client_app:client_app"}


def test_digits_cache_holds_exactly_scikit_learns_split(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from fedpers import data

    monkeypatch.setenv("FEDPERS_DATA_DIR", str(tmp_path))
    first = data.load_digits_dataset()  # builds with scikit-learn, writes the cache
    cache = tmp_path / data.DIGITS_CACHE
    assert cache.is_file() and cache.stat().st_mode & 0o777 == 0o644
    bunch = load_digits()
    x = (bunch.images / 16.0 * 255.0).astype(np.uint8)
    x_tr, x_te, y_tr, y_te = train_test_split(x, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0)
    built = data.from_arrays("digits", x_tr, y_tr, x_te, y_te, num_classes=10)
    cached = data.load_digits_dataset()  # read back from the file
    for ds in (first, cached):
        for name in ("x_train", "y_train", "x_test", "y_test"):
            assert np.array_equal(getattr(ds, name), getattr(built, name)), name
        assert getattr(ds, "x_train").dtype == built.x_train.dtype
    assert sorted(np.load(cache).files) == ["x_test", "x_train", "y_test", "y_train"]


def test_a_corrupt_digits_cache_is_rebuilt(tmp_path, monkeypatch):
    from fedpers import data

    monkeypatch.setenv("FEDPERS_DATA_DIR", str(tmp_path))
    (tmp_path / data.DIGITS_CACHE).write_bytes(b"not an npz")
    ds = data.load_digits_dataset()
    assert len(ds.y_train) == 1437 and len(ds.y_test) == 360
    assert len(np.load(tmp_path / data.DIGITS_CACHE)["y_train"]) == 1437  # replaced by a whole file


class _FakeGrid:
    """Replies become visible at given pull numbers; counts pulls."""

    def __init__(self, ready_after: dict[str, int]):
        self.ready_after, self.pulls, self.pushed = ready_after, 0, []

    def push_messages(self, messages):
        self.pushed.extend(messages)
        return list(self.ready_after)

    def pull_messages(self, ids):
        self.pulls += 1
        return [_Reply(i) for i in list(ids) if self.ready_after[i] <= self.pulls]


class _Reply:
    def __init__(self, reply_to: str):
        self.metadata = type("M", (), {"reply_to_message_id": reply_to})()


def _prompt(fake, interval):
    from fedpers.prompt_grid import PromptReplyGrid

    return PromptReplyGrid(fake, interval)


def test_prompt_grid_returns_every_reply_as_soon_as_the_last_arrives():
    import time

    fake = _FakeGrid({"a": 1, "b": 3, "c": 5})
    t0 = time.monotonic()
    replies = _prompt(fake, 0.01).send_and_receive(["m1", "m2", "m3"], timeout=None)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["a", "b", "c"]
    assert fake.pulls == 5 and time.monotonic() - t0 < 1.0  # five checks 0.01 s apart, not 3-s ticks


def test_prompt_grid_keeps_flowers_timeout_contract():
    import time

    fake = _FakeGrid({"a": 1, "b": 10**9})
    t0 = time.monotonic()
    replies = _prompt(fake, 0.05).send_and_receive(["m1", "m2"], timeout=0.3)
    elapsed = time.monotonic() - t0
    assert [r.metadata.reply_to_message_id for r in replies] == ["a"]  # what arrived in time
    assert 0.3 <= elapsed < 0.6


def test_prompt_grid_refuses_a_non_positive_interval():
    from fedpers.prompt_grid import PromptReplyGrid

    with pytest.raises(ValueError, match="poll_interval"):
        PromptReplyGrid(object(), 0.0)


def test_message_timing_mod_logs_one_line_per_message(tmp_path, monkeypatch):
    from fedpers import client_app

    log = tmp_path / "timing.jsonl"
    monkeypatch.setenv(client_app.TIMING_ENV, str(log))
    meta = type("Meta", (), {"message_type": "train", "group_id": "2"})()
    msg = type("Msg", (), {"metadata": meta})()
    ctx = type("Ctx", (), {"node_config": {"partition-id": 1}})()

    def handler(m, c):
        client_app._client_built_at.append(12.5)
        return "reply"

    assert client_app.message_timing(msg, ctx, handler) == "reply"
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["type"] == "train" and record["group"] == "2" and record["partition_id"] == 1
    assert record["client_built"] == 12.5 and record["reply_ready"] >= record["handed_over"]
    assert record["process_start"] is None or record["process_start"] <= record["handed_over"]
    monkeypatch.delenv(client_app.TIMING_ENV)
    assert client_app.message_timing(msg, ctx, handler) == "reply" and len(log.read_text().splitlines()) == 1
