"""What a deployed message pays: the ClientApp's imports, the digits cache, the reply polling."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT


def test_clientapp_imports_no_server_side_modules():
    code = ("import sys, fedpers.apps.client_app; print(sorted(m for m in ('sklearn', 'scipy', 'pandas', 'matplotlib', "
            "'ray', 'strategies', 'fedpers.core.results', 'fedpers.core.run_figures', 'fedpers.apps.server_app') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_pyproject_names_the_light_clientapp():
    import tomllib

    components = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "fedpers.apps.server_app:server_app", "clientapp": "fedpers.apps.client_app:client_app"}


def test_digits_cache_holds_exactly_scikit_learns_split(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from fedpers.core import data

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
    from fedpers.core import data

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
    from fedpers.apps.prompt_grid import PromptReplyGrid

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
    from fedpers.apps.prompt_grid import PromptReplyGrid

    with pytest.raises(ValueError, match="poll_interval"):
        PromptReplyGrid(object(), 0.0)


def test_message_timing_mod_logs_one_line_per_message(tmp_path, monkeypatch):
    from fedpers.apps import client_app

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


def _digits_cfg(**extra):
    from fedpers.registry.config import build_config
    from tests.conftest import tiny_overrides

    return build_config(tiny_overrides(method="fedper", **extra))


def test_client_slice_is_that_clients_exact_samples(tmp_path, monkeypatch):
    import torch

    from fedpers.core import federation as fedmod

    cfg = _digits_cfg()
    full = fedmod.get_federation(cfg).client(1, torch.device("cpu"))
    monkeypatch.setattr(fedmod, "_built", set())  # a fresh ClientApp process: nothing built yet
    with fedmod.use_client_slice(cfg, 1, str(tmp_path)):  # first message of the node: builds, saves
        assert isinstance(fedmod.get_federation(cfg), fedmod.Federation)
    (saved,) = (tmp_path / "data").iterdir()
    assert saved.name == f"partition-1-{fedmod.data_key(cfg)}.npz"
    assert not (tmp_path / "partition-1").exists()  # the client-state folder holds client state only
    monkeypatch.setattr(fedmod, "_built", set())  # the next message's fresh process
    with fedmod.use_client_slice(cfg, 1, str(tmp_path)):
        view = fedmod.get_federation(cfg)
        assert isinstance(view, fedmod.ClientSlice)
        assert (view.num_clients, view.num_classes, view.input_shape) == (3, 10, (1, 8, 8))
        mine = view.client(1, torch.device("cpu"))
        for a, b in ((mine.train, full.train), (mine.test, full.test)):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        with pytest.raises(Exception, match="partition 1 asked for partition 2"):
            view.client(2, torch.device("cpu"))
        assert not fedmod._built  # the whole dataset was not loaded
        other = _digits_cfg(alpha=0.3)  # another split: not this slice
        assert isinstance(fedmod.get_federation(other), fedmod.Federation)
    assert isinstance(fedmod.get_federation(cfg), fedmod.Federation)  # outside the block: as always


def test_client_slice_is_skipped_where_the_federation_is_in_memory_and_rebuilt_when_corrupt(tmp_path, monkeypatch):
    from fedpers.core import federation as fedmod

    cfg = _digits_cfg()
    fedmod.get_federation(cfg)  # a simulation actor already holds the whole Federation
    with fedmod.use_client_slice(cfg, 0, str(tmp_path)):
        assert isinstance(fedmod.get_federation(cfg), fedmod.Federation)
    assert not (tmp_path / "data").exists()  # nothing written
    monkeypatch.setattr(fedmod, "_built", set())
    path = fedmod.client_slice_path(tmp_path, 0, fedmod.data_key(cfg))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a file")
    with fedmod.use_client_slice(cfg, 0, str(tmp_path)):
        assert isinstance(fedmod.get_federation(cfg), fedmod.Federation)  # unreadable: built from the data
    monkeypatch.setattr(fedmod, "_built", set())
    with fedmod.use_client_slice(cfg, 0, str(tmp_path)):
        assert isinstance(fedmod.get_federation(cfg), fedmod.ClientSlice)  # and saved whole this time


def test_data_key_follows_the_data_files(tmp_path):
    import os

    from fedpers.core.federation import data_key

    npz = tmp_path / "mine.npz"
    npz.write_bytes(b"x")
    cfg = _digits_cfg(dataset=str(npz))
    before = data_key(cfg)
    os.utime(npz, ns=(1, 1))  # the same path, another file
    assert data_key(cfg) != before and data_key(_digits_cfg()) != data_key(_digits_cfg(seed=1))
