"""Config schema, data loading errors, and the CLI's one-line errors."""

import subprocess
import sys
import tomllib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpers.registry.config import all_keys, build_config, full_schema, load_config, parse_set_arguments
from fedpers.core.data import load_dataset, load_npz
from fedpers.core.errors import ConfigError, DataError
from tests.conftest import ROOT


def test_pyproject_run_config_is_the_quickstart_over_schema_defaults():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    flower = pyproject["tool"]["flwr"]["app"]["config"]
    assert set(flower) == {k.name for k in all_keys()}
    assert flower == load_config(ROOT / "configs" / "quickstart.yaml").to_dict()


def test_pyproject_run_config_table_is_the_generated_one_and_a_hand_edit_is_caught(tmp_path):
    from fedpers.apps.run_config_table import pyproject_in_sync, write_pyproject

    assert pyproject_in_sync(ROOT / "pyproject.toml")
    edited = tmp_path / "pyproject.toml"
    edited.write_text((ROOT / "pyproject.toml").read_text().replace('\nrounds = 20\n', '\nrounds = 21\n'))
    assert not pyproject_in_sync(edited)
    assert write_pyproject(edited) and edited.read_text() == (ROOT / "pyproject.toml").read_text()
    assert not write_pyproject(edited)


def test_set_values_are_text_that_the_schema_types():
    assert parse_set_arguments(["alpha=0.05", "method=pfedkdh", "rounds=3", "data_dir=", "seed=null",
                                'out_dir="a #1: b"', "wandb_project='it''s'"]) == {
        "alpha": "0.05", "method": "pfedkdh", "rounds": "3", "data_dir": "", "seed": "", "out_dir": "a #1: b",
        "wandb_project": "it's"}
    cfg = load_config(None, ["alpha=0.5", "num_clients=7", "rounds=3.0", "tensorboard=true", "out_dir=x #2: y"])
    assert cfg.alpha == 0.5 and cfg.num_clients == 7 and isinstance(cfg.alpha, float)
    assert cfg.rounds == 3 and cfg.tensorboard is True and cfg.out_dir == "x #2: y"


@pytest.mark.parametrize("overrides, message", [
    ({"alpah": 0.1}, "unknown config key 'alpah' (did you mean 'alpha'?)"),
    ({"alpha": 0}, "config key 'alpha': must be > 0"),
    ({"alpha": "abc"}, "config key 'alpha': expected float"),
    ({"rounds": 2.5}, "config key 'rounds': expected int"),
    ({"method": "fedvag"}, "did you mean 'fedavg'"),
    ({"variant": "both"}, "config key 'variant': must be one of fair, ea"),
    ({"fraction_fit": 1.5}, "config key 'fraction_fit'"),
    ({"method": "pfedkdh", "aux_size": 0}, "needs the server's auxiliary set"),
])
def test_bad_config_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config(overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from([k.name for k in all_keys()]),
       value=st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8), st.booleans()))
def test_any_value_is_accepted_or_rejected_with_a_config_error(key, value):
    try:
        cfg = build_config({key: value})
    except ConfigError as exc:
        assert key in str(exc) or "aux_size" in str(exc)
    else:
        assert isinstance(cfg[key], full_schema().by_name[key].type)


def test_malformed_yaml_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("alpha: [1, 2\nmethod: x")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    nested = tmp_path / "nested.yaml"
    nested.write_text("alpha:\n  a: 1\n")
    with pytest.raises(ConfigError, match="expected a scalar"):
        load_config(nested)


def test_npz_validation(tmp_path):
    good = tmp_path / "good.npz"
    rng = np.random.default_rng(0)
    np.savez(good, x_train=rng.integers(0, 255, (20, 8, 8), dtype=np.uint8), y_train=np.arange(20) % 3,
             x_test=rng.integers(0, 255, (6, 8, 8), dtype=np.uint8), y_test=np.arange(6) % 3)
    ds = load_npz(good)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 3 and ds.x_train.dtype == np.float32
    missing = tmp_path / "missing.npz"
    np.savez(missing, x_train=np.zeros((2, 4, 4)))
    with pytest.raises(DataError, match="missing arrays"):
        load_npz(missing)
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"not a zip file")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(corrupt)
    badlabels = tmp_path / "badlabels.npz"
    np.savez(badlabels, x_train=np.zeros((4, 4, 4)), y_train=[0, 1, 2, 5], x_test=np.zeros((2, 4, 4)),
             y_test=[0, 1], class_names=np.array(["a", "b", "c"]))
    with pytest.raises(DataError, match=r"labels outside \[0, 3\)"):
        load_npz(badlabels)
    shapes = tmp_path / "shapes.npz"
    np.savez(shapes, x_train=np.zeros((4, 4, 4)), y_train=[0, 1, 0, 1], x_test=np.zeros((2, 5, 5)), y_test=[0, 1])
    with pytest.raises(DataError, match="differ"):
        load_npz(shapes)
    with pytest.raises(DataError, match="not found"):
        load_dataset(str(tmp_path / "nope.npz"))


def test_shared_mnist_loads(shared_data):
    ds = load_dataset(str(shared_data / "mnist.npz"))
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.num_classes == 10
    assert abs(float(ds.x_train.mean())) < 1e-3


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fedpers", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["run", "--set", "method=nope"], "unknown method 'nope'"),
    (["run", "--set", "dataset=imagenet"], "unknown dataset 'imagenet'"),
    (["run", "--set", "dataset=/no/such/file.npz"], "data file not found"),
    (["run", "--set", "dataset=digits", "--set", "aux_size=10", "--set", "num_clients=5000"], "exceeds"),
    (["run", "--set", "rounds=ten"], "config key 'rounds': expected int"),
    (["run", "--set", "alpha=-1"], "config key 'alpha': must be > 0"),
    (["run", "--set", "colour=red"], "unknown config key 'colour'"),
    (["run", "no_such_config.yaml"], "config file not found"),
])
def test_cli_bad_input_is_one_line_and_nonzero(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedpers: error:") and message in lines[0], res.stderr


def test_choice_values_that_yaml_1_1_reads_as_booleans_stay_strings(tmp_path):
    # "off" is a boolean in YAML 1.1; a config reads YAML 1.2 booleans (true/false only)
    cfg = load_config(None, ["method=fedeagd", "fedeagd_fusion=off", "jdfl=off", "fedeagd_teacher=false"])
    assert cfg.fedeagd_fusion == "off" and cfg.jdfl == "off" and cfg.fedeagd_teacher is False
    path = tmp_path / "c.yaml"
    path.write_text("method: fedeagd\nfedeagd_fusion: off\nfedeagd_teacher: no\n")
    cfg = load_config(path)
    assert cfg.fedeagd_fusion == "off" and cfg.fedeagd_teacher is False
    with pytest.raises(ConfigError, match="config key 'fedeagd_teacher': expected bool"):
        load_config(None, ["fedeagd_teacher=maybe"])


# pFedKDH's keys keep the unprefixed names of its paper's notation (T, lambda_KD, E_w, ...) that configs,
# studies and committed results use (ea_epochs and ea_also join the ea_ family of its EA variant); every
# other method's and extension's keys carry its name.
PFEDKDH_PAPER_NAMES = {"variant", "temperature", "lambda_kd", "recal_epochs", "recal_every_round", "recal_lr",
                       "warmup_epochs", "ea_steps", "ea_lr", "ea_epochs", "ea_also"}


def test_each_method_declares_its_own_prefixed_keys_and_the_core_none_of_theirs():
    from fedpers.registry.methods import EXTENSIONS, METHODS

    schema = full_schema()
    owners = [owner for owner, _ in schema.sections]
    assert owners[0] == "core" and set(owners[1:]) <= set(METHODS) | {e.name for e in EXTENSIONS}
    assert "fedeagd" in owners and "jdfl" in owners and "pfedkdh" in owners
    for owner, keys in schema.sections[1:]:
        assert keys, owner
        for key in keys:
            if owner == "pfedkdh":
                assert key.name in PFEDKDH_PAPER_NAMES, key.name
            else:
                assert key.name == owner or key.name.startswith(owner + "_"), (owner, key.name)
    method_prefixes = tuple(f"{name}_" for name in owners[1:])
    assert not [k.name for k in schema.sections[0][1] if k.name.startswith(method_prefixes)]
    assert schema.owner_of["fedeagd_ema_decay"] == "fedeagd" and schema.owner_of["alpha"] == "core"


def test_a_key_declared_by_two_sections_is_refused_naming_both():
    from fedpers.core.schema import CORE_KEYS, Key, Schema

    with pytest.raises(ValueError, match="'alpha' is declared by both 'core' and 'fedfoo'"):
        Schema((("core", CORE_KEYS), ("fedfoo", (Key("alpha", float, 1.0, "clash"),))))


def test_a_changed_default_keeps_saved_state_tied_to_the_values_it_was_made_with():
    """pFedKDH's lambda_kd, temperature and ea_steps changed defaults (0.5, 3, 10 -> 0.1, 1, 50). The
    fingerprints recorded before the change: a run at the old defaults (44136fa355b3678a) and one that set
    0.1, 1, 50 explicitly (6e877a1509d112d8). Today a run that pins the old values finds the first's saved
    state, a run at today's defaults the second's, and neither the other's."""
    from fedpers.core.state_store import config_fingerprint

    today = build_config({"method": "pfedkdh"})
    assert (today.lambda_kd, today.temperature, today.ea_steps) == (0.1, 1.0, 50)
    old_values = {"lambda_kd": 0.5, "temperature": 3.0, "ea_steps": 10}
    assert config_fingerprint(build_config({"method": "pfedkdh", **old_values})) == "44136fa355b3678a"
    assert config_fingerprint(today) == "6e877a1509d112d8"
    assert config_fingerprint(build_config({"method": "pfedkdh", "lambda_kd": 0.1, "temperature": 1.0,
                                            "ea_steps": 50})) == "6e877a1509d112d8"
    # another method's run: the same whether a study pins pFedKDH's old values for every row or not
    assert config_fingerprint(build_config({"method": "fedper", **old_values})) \
        == config_fingerprint(build_config({"method": "fedper"}))


def test_experiment_fingerprints_are_unchanged_by_where_keys_are_declared():
    # Checkpoints and client state on disk are matched by this fingerprint: values recorded before the
    # methods' keys moved out of fedpers/core/schema.py into fedpers/algorithms/<method>.py.
    from fedpers.core.state_store import config_fingerprint

    recorded = {
        # pFedKDH at the defaults of the day (lambda_kd 0.5, T 3, 10 EA steps), pinned since they changed
        (("lambda_kd", 0.5), ("temperature", 3.0), ("ea_steps", 10)): "44136fa355b3678a",
        (("method", "fedeagd"), ("alpha", 0.1), ("rounds", 100)): "3bc9c2b24a81e0c9",
        # pFedKDH's lambda_kd and ea_steps at the defaults of the day (0.5, 10), pinned since they changed
        (("method", "pfedkdh"), ("variant", "ea"), ("temperature", 2.0), ("lambda_kd", 0.5), ("ea_steps", 10)):
            "42c93ef265579807",
        (("method", "fedavg"), ("jdfl", "graded"), ("aux_size", 0), ("jdfl_tau", 0.2)): "3ad67ec382a7526c",
    }
    for overrides, fingerprint in recorded.items():
        assert config_fingerprint(build_config(dict(overrides))) == fingerprint, overrides


def test_a_yaml_merge_key_is_read_and_the_files_own_keys_win(tmp_path):
    """`<<:` (YAML's merge key) is valid YAML: its keys come in, the mapping's own override them, and a key
    the mapping itself gives twice is still refused."""
    from fedpers.registry.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("<<: {rounds: 3, lr: 0.1, dataset: digits}\nlr: 0.5\n")
    cfg = load_config(str(path))
    assert (cfg.rounds, cfg.lr, cfg.dataset) == (3, 0.5, "digits")
    path.write_text("<<: {rounds: 3}\nlr: 0.5\nlr: 0.6\n")
    with pytest.raises(ConfigError, match="appears twice"):
        load_config(str(path))
