"""The one config schema of fedpers (core layer): YAML files, ``--set key=value`` overrides and Flower
run-config.

Every hyperparameter is a flat key with a type, a default, a range and a help text. The same names are
used in YAML, on the CLI (``fedpers run CFG --set alpha=0.5``) and in ``flwr run . --run-config``.
Defaults follow the pFedKDH paper's Table 1 (MNIST column) where the paper gives a value; values the
paper leaves out are marked "ours" in the help text and in docs/methods.md.

This module holds the keys every run has (:data:`CORE_KEYS`: data, split, training budget, model, run
mechanics, robustness, deployment) and the machinery (:class:`Key`, :class:`Schema`, :class:`Config`, the
range checks, YAML reading). Each method declares its own keys next to its math, as ``KEYS`` in
``fedpers/algorithms/<method>.py`` (prefixed with the method's name); nothing here knows the methods:
:mod:`fedpers.registry.config` (registry layer) assembles the run's full table from the registry and adds the
checks that need it (the method's name, what JDFL can wrap, which methods need Ds).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from fedpers.core.errors import ConfigError, shown
from fedpers.core.synthetic import SYNTHETIC

Value = bool | int | float | str
ValuesCheck = Callable[[dict], None]  # a check of all values together; raises ConfigError


@dataclass(frozen=True)
class Key:
    """One config key: its type, default, help text and an optional range/choice check."""

    name: str
    type: type
    default: Value
    help: str
    check: Callable[[Any], str | None] | None = None
    # The default this key had when saved state (checkpoints, client state) first recorded it, where the
    # default has changed since; None: never changed. The experiment fingerprint compares with it, so that
    # state saved before the change stays tied to the values it was made with (see config_fingerprint).
    first_default: Value | None = None
    # The methods that read this key, where it is a core key only some methods read (``mu``: pFedKDH and
    # FedProx); empty: every run reads it. A run of another method that sets it is warned, as for another
    # method's own key.
    read_by: tuple[str, ...] = ()
    # The datasets a run reads this key with (``synthetic_alpha``: only ``dataset: synthetic``), or those it
    # is not read with (the split keys: synthetic data are split by their generator); empty: every dataset.
    # Set on another dataset, it is warned about and left out of the experiment fingerprint, as above.
    datasets: tuple[str, ...] = ()
    not_datasets: tuple[str, ...] = ()

    def read_with(self, values: Mapping[str, Any]) -> bool:
        """Whether a run with ``values`` reads this key (its method and its dataset)."""
        if self.read_by and values.get("method") not in self.read_by:
            return False
        dataset = values.get("dataset")
        return (not self.datasets or dataset in self.datasets) and dataset not in self.not_datasets

    def readers(self) -> str:
        """Who reads this key, where not every run does (``pfedkdh, fedprox``, ``dataset synthetic``)."""
        parts = [", ".join(self.read_by)] if self.read_by else []
        parts += [f"dataset {', '.join(self.datasets)}"] if self.datasets else []
        parts += [f"datasets other than {', '.join(self.not_datasets)}"] if self.not_datasets else []
        return "; ".join(parts)


def positive(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is > 0, else the problem."""
    return None if v > 0 else "must be > 0"


def non_negative(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is >= 0, else the problem."""
    return None if v >= 0 else "must be >= 0"


def at_least_one(v: int) -> str | None:
    """Range check of a Key: None when ``v`` is >= 1, else the problem."""
    return None if v >= 1 else "must be >= 1"


def unit_interval_open_left(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is in (0, 1], else the problem."""
    return None if 0 < v <= 1 else "must be in (0, 1]"


def unit_interval_open(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is in (0, 1), else the problem."""
    return None if 0 < v < 1 else "must be in (0, 1)"


def unit_interval(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is in [0, 1], else the problem."""
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def unit_interval_open_right(v: float) -> str | None:
    """Range check of a Key: None when ``v`` is in [0, 1), else the problem."""
    return None if 0 <= v < 1 else "must be in [0, 1)"


def non_empty(v: str) -> str | None:
    """Check of a Key naming a directory that must be given: an empty value would mean the current
    directory (``--out ""`` would write results and the run's lock there)."""
    return None if v.strip() else "must name a directory, not be empty"


def parses(parse: Callable[[str], Any]) -> Callable[[str], str | None]:
    """Range check of a text Key that ``parse`` reads (a list of lengths, ...): None when it parses, else
    the ValueError's message."""
    def check(text: str) -> str | None:
        try:
            parse(text)
        except ValueError as exc:
            return str(exc)
        return None
    return check


def one_of(*choices: str) -> Callable[[str], str | None]:
    """Choice check of a Key: None when the value is one of ``choices``, else the problem."""
    def check(v: str) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    check.choices = choices  # type: ignore[attr-defined]
    return check


def _id_list(v: str) -> str | None:
    try:
        ids = parse_id_list(v)
    except ValueError:
        return "must be comma-separated non-negative integers, e.g. '0,3'"
    return None if all(i >= 0 for i in ids) else "must be comma-separated non-negative integers"


def parse_id_list(text: str) -> list[int]:
    """``"1, 3"`` -> ``[1, 3]``; ``""`` -> ``[]``."""
    return [int(part) for part in text.split(",") if part.strip()]


# The generated dataset (fedpers/core/synthetic.py): its own keys, and the split keys that do not apply to it
# (its generator gives each client its own distribution)
SYNTHETIC_ONLY = (SYNTHETIC,)

CORE_KEYS: tuple[Key, ...] = (
    # --- what to run -------------------------------------------------------------------------
    Key("method", str, "pfedkdh", "federated method (see `fedpers methods`; checked by fedpers.registry.config)"),
    Key("dataset", str, "mnist",
        "digits | mnist | fmnist | cifar10 | cifar100 | synthetic (the FedProx paper's Synthetic(alpha, beta), "
        "generated per client: see synthetic_alpha), or a path to a Keras-layout .npz file"),
    Key("data_dir", str, "",
        "directory holding <dataset>.npz or torchvision files; '' = ~/.cache/fedpers/data (download)",
        not_datasets=SYNTHETIC_ONLY),
    Key("synthetic_alpha", float, 1.0,
        "dataset=synthetic: alpha of Synthetic(alpha, beta) (Li et al., MLSys 2020, Sec. 5.1): client k's "
        "model W_k, b_k ~ N(u_k, 1) with u_k ~ N(0, alpha), how much the clients' labelling rules differ "
        "(1, 1 is the paper's most heterogeneous setting)", non_negative, datasets=SYNTHETIC_ONLY),
    Key("synthetic_beta", float, 1.0,
        "dataset=synthetic: beta of Synthetic(alpha, beta) (Li et al., MLSys 2020, Sec. 5.1): client k's "
        "input mean v_k ~ N(B_k, 1) with B_k ~ N(0, beta), how much the clients' inputs differ",
        non_negative, datasets=SYNTHETIC_ONLY),
    Key("synthetic_iid", bool, False,
        "dataset=synthetic: the paper's Synthetic-IID instead (Li et al., MLSys 2020, Sec. 5.1): one W, b "
        "shared by all clients, v_k = 0; synthetic_alpha and synthetic_beta are not read",
        datasets=SYNTHETIC_ONLY),
    Key("partition", str, "dirichlet",
        "client split: dirichlet | pathological | iid | file | domain (one domain per client, needs domain ids) "
        "| flwr (a flwr-datasets partitioner, see flwr_partitioner)",
        one_of("dirichlet", "pathological", "iid", "file", "domain", "flwr")),
    Key("flwr_partitioner", str, "DirichletPartitioner",
        "partition=flwr: class name of a flwr_datasets.partitioner (e.g. PathologicalPartitioner, ShardPartitioner)",
        not_datasets=SYNTHETIC_ONLY),
    Key("flwr_partitioner_args", str, "",
        "partition=flwr: its keyword arguments as a YAML mapping, e.g. '{alpha: 0.3}' (num_partitions, "
        "partition_by=label and seed are set unless given)", not_datasets=SYNTHETIC_ONLY),
    Key("flwr_test_fraction", float, 0.25,
        "partition=flwr: share of each client's partition held out as its test split (ours: PFLlib's 75/25)",
        unit_interval_open, not_datasets=SYNTHETIC_ONLY),
    Key("partition_file", str, "", "partition.npz to take clients, splits and Ds from (partition=file)",
        not_datasets=SYNTHETIC_ONLY),
    Key("alpha", float, 0.05, "Dirichlet concentration of the class-wise label skew", positive,
        not_datasets=SYNTHETIC_ONLY),
    Key("classes_per_client", int, 2, "classes per client for partition=pathological", at_least_one,
        not_datasets=SYNTHETIC_ONLY),
    Key("min_samples_per_client", int, 10,
        "a Dirichlet draw is redone until every client has this many train samples (ours)", at_least_one,
        not_datasets=SYNTHETIC_ONLY),
    Key("num_clients", int, 20, "number of clients K", at_least_one),
    Key("fraction_fit", float, 0.5, "participation ratio rho: share of clients sampled per round",
        unit_interval_open_left),
    Key("rounds", int, 50, "communication rounds R", at_least_one),
    Key("local_epochs", int, 2, "local epochs E per round", at_least_one),
    Key("batch_size", int, 64, "mini-batch size for local training and evaluation", at_least_one),
    Key("drop_last_batch", bool, False,
        "every mini-batch SGD loop of a model (local epochs, FedBABU fine-tuning, pFedKDH head adaptation, "
        "recalibration and warm-up, FedAS alignment; not FedALA's weight learning) skips an epoch's last "
        "batch when it is smaller than batch_size, as PFLlib's train loader (DataLoader drop_last=True), "
        "unless a client has fewer than batch_size samples (ours: it then trains on one batch of all of "
        "them); false: the last batch is one SGD step like any other"),
    Key("lr", float, 0.015, "client SGD learning rate", positive),
    Key("momentum", float, 0.0, "client SGD momentum (ours: plain SGD)", unit_interval_open_right),
    Key("weight_decay", float, 0.0, "client SGD weight decay (ours)", non_negative),
    Key("seed", int, 0, "seed of partitioning, model init, client sampling and training", non_negative),
    Key("aux_size", int, 5000, "size of the server's labelled auxiliary set Ds (0 = none)", non_negative),
    Key("val_fraction", float, 0.0,
        "share of each client's training samples held out as its validation split (seeded, stratified by "
        "class, never trained on; 0 = none): every evaluated round then records val_* accuracies beside "
        "the test ones, and values are chosen on those, never on the test split (ours)",
        unit_interval_open_right),
    # --- model ---------------------------------------------------------------------------------
    Key("model_kind", str, "",
        "model: '' = the method's own (cnn for most; on dataset=synthetic mlp, residual_mlp for fedeagd) | cnn | "
        "se_cnn | gn_cnn (JDFL paper's GroupNorm CNN) | mlp (one hidden layer, for vector data) | residual_mlp "
        "(mlp with FedEAGD's gated residual branch)",
        one_of("", "cnn", "se_cnn", "gn_cnn", "mlp", "residual_mlp")),
    Key("dropout", float, 0.25, "dropout rate of the CNN backbone (ours)", unit_interval_open_right),
    Key("feature_dim", int, 512, "width of the backbone's FC projection = head input (ours, as PFLlib)",
        at_least_one),
    # --- run mechanics -------------------------------------------------------------------------
    Key("eval_every", int, 1, "evaluate all clients every this many rounds (and at the last round)",
        at_least_one),
    Key("eval_clients", int, 0,
        "clients evaluated per evaluation round: 0 (or >= num_clients) = all; else that many, drawn by a "
        "seeded stream of their own (seed, round), the same for every method at the same seed, so paired "
        "comparisons stay paired (ours)", non_negative),
    Key("eval_among", str, "all",
        "which clients an evaluation round evaluates: all = every client (or eval_clients of them) | trained = "
        "those drawn for fit in this or an earlier round (or eval_clients of them, by the same seeded "
        "stream): with 100,000 clients and 100 a round, a client drawn at random has almost never trained, "
        "and a personalized model it never trained says nothing of the method (ours)", one_of("all", "trained")),
    Key("device", str, "auto", "auto (CUDA when present) | cpu | cuda", one_of("auto", "cpu", "cuda")),
    Key("client_cpus", float, 1.0, "CPUs per simulated client (Ray resources)", positive),
    Key("client_gpus", float, 0.0, "GPUs per simulated client, fractional allowed (Ray resources)",
        non_negative),
    Key("ray_address", str, "",
        "join this Ray cluster (HEAD_IP:PORT, see docs/running.md) instead of starting a private local Ray"),
    Key("out_dir", str, "results/latest", "where metrics.jsonl and summary.json are written", non_empty),
    Key("tensorboard", bool, False, "also write each round's metrics as TensorBoard events in out_dir/tensorboard"),
    Key("wandb", str, "off",
        "Weights & Biases logging of every round (optional extra fedpers[wandb]): off | offline (files in "
        "<out_dir>/wandb, `wandb sync` them later) | online", one_of("off", "offline", "online")),
    Key("wandb_project", str, "fedpers", "Weights & Biases project name (wandb: offline | online)"),
    # --- robustness --------------------------------------------------------------------------------
    Key("aggregation", str, "mean",
        "rule for the shared part: mean (sample-weighted) | median | trimmed_mean (coordinate-wise)",
        one_of("mean", "median", "trimmed_mean")),
    Key("trim_fraction", float, 0.1, "share cut from each end by aggregation=trimmed_mean",
        lambda v: None if 0 <= v < 0.5 else "must be in [0, 0.5)"),
    Key("max_update_samples", int, 0,
        "reject updates claiming more samples than this; 0 = the client's train size in the split",
        non_negative),
    Key("min_fit_updates", int, 1, "a round with fewer valid updates stops the run with an error",
        at_least_one),
    Key("faulty_clients", str, "",
        "fault injection: comma-separated partition ids whose updates are corrupted (robustness studies)",
        _id_list),
    Key("fault", str, "nan", "what faulty_clients send: nan (NaN arrays) | noise (update + N(0, 10^2))",
        one_of("nan", "noise")),
    # --- a local objective term shared by methods -------------------------------------
    Key("mu", float, 0.01, "proximal weight mu of pFedKDH Eq. 2 and FedProx (ours)", non_negative,
        read_by=("pfedkdh", "fedprox")),
    # --- deployment: client state on disk, server checkpoint/resume, round timeout (fedpers/apps/deploy.py) ----
    Key("client_state_dir", str, "",
        "deployment: each client also writes its persistent state (heads, teachers, ...) atomically to "
        "<dir>/partition-<id>/ and restores it after a restart; '' = in memory only (node config "
        "'state-dir' overrides)"),
    Key("client_state_spill", bool, False,
        "keep per-client state (heads, EMA teachers, personal models, ...) only on disk in client_state_dir "
        "instead of in memory: memory no longer grows with the number of clients, at one file read and "
        "write per sampled client per round (fedpers run without client_state_dir uses a fresh "
        "<out_dir>/client_state-XXXXXXXX made for the run, removed when it ends; ours)"),
    Key("client_layout", str, "auto",
        "simulation: nodes = one SuperNode per client (Flower's own node model; client state in memory or "
        "on disk) | pool = a fixed pool of pool_nodes SuperNodes serves every client, each message naming "
        "the partition it is for (no message per client before round 1; client state on disk, in "
        "client_state_dir) | auto = pool above 1,000 clients, else nodes. Deployments always "
        "run one client per SuperNode (ours)", one_of("auto", "nodes", "pool")),
    Key("pool_nodes", int, 0,
        "client_layout=pool: SuperNodes in the pool; 0 = the clients sampled per round (ours)", non_negative),
    Key("checkpoint_dir", str, "",
        "server checkpoint (global model, round, history) written atomically after every round; '' = none"),
    Key("resume", bool, False,
        "continue from the checkpoint in checkpoint_dir at its next round (metrics.jsonl keeps the done rounds)"),
    Key("overwrite", bool, False,
        "replace the run already in out_dir (summary.json, metrics.jsonl); without it such an out_dir is refused"),
    Key("round_timeout", float, 0.0,
        "seconds a round waits for client replies (Flower ServerConfig.round_timeout); 0 = the engine's "
        "default: no limit in a simulation, 1800 s on Flower's Deployment Engine (deploy local, compose)",
        non_negative),
    Key("reply_poll_interval", float, 0.2,
        "seconds between the ServerApp's checks for client replies (ours; Flower's own Grid waits 3 s, which "
        "adds up to 3 s to every fit and evaluate phase of a deployed round)", positive),
    Key("evaluate_with_next_fit", bool, True,
        "a client sampled again in the next round gets this round's evaluation in that fit message instead "
        "of an evaluate message of its own (same broadcast, same numbers: one message per client per round; "
        "the round's record is written when the next round's fit replies are in; ours, PFLlib's order). "
        "Methods whose fit broadcast is per client (pFedSim, FedFed) always send evaluate messages"),
)

class Schema:
    """A table of config keys (no name twice) and the checks of all values together: what
    :meth:`build` validates a config against. The core holds :data:`CORE_KEYS`; the full table of a run
    (the core's keys, then each method's own ``KEYS``) is assembled by :mod:`fedpers.registry.config`."""

    def __init__(self, sections: tuple[tuple[str, tuple[Key, ...]], ...], checks: tuple[ValuesCheck, ...] = (),
                 owners_read: Callable[[Mapping[str, Value]], set[str]] | None = None):
        """``sections``: (owner, keys) pairs in table order, e.g. ``("core", CORE_KEYS)``, ``("fedeagd", ...)``;
        ``checks`` run on all values after each key's own check (the first one before them);
        ``owners_read``: the sections whose keys a run with given values reads (None: all)."""
        self.owners_read = owners_read
        self.sections = tuple((owner, tuple(keys)) for owner, keys in sections)
        self.keys: tuple[Key, ...] = tuple(key for _, keys in self.sections for key in keys)
        self.by_name: dict[str, Key] = {}
        self.owner_of: dict[str, str] = {}
        for owner, keys in self.sections:
            for key in keys:
                if key.name in self.by_name:
                    raise ValueError(f"config key '{key.name}' is declared by both "
                                     f"'{self.owner_of[key.name]}' and '{owner}'")
                self.by_name[key.name] = key
                self.owner_of[key.name] = owner
        self.checks = tuple(checks)

    def defaults(self) -> dict[str, Value]:
        """Every key with its default."""
        return {k.name: k.default for k in self.keys}

    def fingerprint_defaults(self) -> dict[str, Value]:
        """Every key with the default the experiment fingerprint compares with: its first default where it
        has changed (:attr:`Key.first_default`), else its default."""
        return {k.name: k.default if k.first_default is None else k.first_default for k in self.keys}

    def unread_keys(self, values: Mapping[str, Value]) -> frozenset[str]:
        """The keys a run with ``values`` does not read: those of the sections ``owners_read`` leaves out
        (another method's, an extension's while it is off); none where the schema has no ``owners_read``."""
        if self.owners_read is None:
            return frozenset()
        read = self.owners_read(values)
        return frozenset(name for name, owner in self.owner_of.items() if owner not in read) | frozenset(
            key.name for key in self.keys if not key.read_with(values))

    def suggest(self, name: str) -> str:
        """`` (did you mean 'x'?)`` for the closest key name, or ''."""
        close = difflib.get_close_matches(name, list(self.by_name), n=1)
        return f" (did you mean '{close[0]}'?)" if close else ""

    def build(self, overrides: Mapping[str, Any], base: Mapping[str, Value] | None = None) -> "Config":
        """Apply ``overrides`` on ``base`` (default: the defaults), validate every key, then run the
        checks (each raises ConfigError), and return a Config.

        Raises ConfigError with one line naming the offending key for an unknown key (with the closest
        valid name), a wrong type or a value out of range.
        """
        values = dict(self.defaults() if base is None else base)
        for name, raw in overrides.items():
            key = self.by_name.get(name)
            if key is None:
                raise ConfigError(f"unknown config key {shown(str(name))}{self.suggest(str(name))}")
            values[name] = coerce_value(key, raw)
        for check in self.checks[:1]:  # the method's name first: the other checks may depend on it
            check(values)
        for key in self.keys:
            if key.check is not None:
                problem = key.check(values[key.name])
                if problem:
                    raise ConfigError(f"config key '{key.name}': {problem}, got {shown(values[key.name])}")
        if values["dataset"] in SYNTHETIC_ONLY and values["partition"] != self.by_name["partition"].default:
            raise ConfigError(f"config key 'partition': dataset synthetic is split by its generator (each client "
                              f"its own distribution), not by partition={values['partition']}; Synthetic-IID is "
                              f"synthetic_iid=true")
        if values["partition"] == "file" and not values["partition_file"]:
            raise ConfigError("config key 'partition_file': partition=file needs partition_file: PATH")
        absent = [i for i in parse_id_list(values["faulty_clients"]) if i >= values["num_clients"]]
        if absent:  # a fault injected into no client would be a robustness study of nothing
            raise ConfigError(f"config key 'faulty_clients': client {absent[0]} does not exist (num_clients="
                              f"{values['num_clients']}: ids 0..{values['num_clients'] - 1})")
        for check in self.checks[1:]:
            check(values)
        return Config(values, self)


# Integers are carried as 64-bit signed numbers by Flower's run-config (and torch's seeds take 64 bits):
# a larger one would pass here and fail after the engine has started.
INT_LIMIT = 2**63


def coerce_value(key: Key, value: Any) -> Value:
    """Return ``value`` converted to ``key.type``, or raise ConfigError naming the key. Text (``--set``,
    quoted YAML) is read as the key's type: ``"0.5"`` for a float, ``"true"`` for a bool, ``"3"`` or
    ``"3.0"`` for an int."""
    t = key.type
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
            return value.lower() in ("true", "yes", "on")
    elif t is int:
        out = None
        if isinstance(value, int) and not isinstance(value, bool):
            out = value
        elif isinstance(value, float) and value.is_integer():
            out = int(value)
        elif isinstance(value, str):
            try:
                out = int(value)
            except ValueError:  # not an integer, or more digits than Python converts (4,300)
                try:
                    number = float(value)
                except ValueError:
                    number = math.nan
                if number.is_integer():
                    out = int(number)
        if out is not None:
            if not -INT_LIMIT <= out < INT_LIMIT:
                raise ConfigError(f"config key '{key.name}': must be below 2**63 (a 64-bit integer), "
                                  f"got {shown(out)}")
            return out
    elif t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                out = float(value)
            except OverflowError:  # an int beyond float's range
                out = math.inf
            if not math.isfinite(out):
                raise ConfigError(f"config key '{key.name}': must be a finite number, got {shown(value)}")
            return out
        if isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                pass
            else:
                if math.isfinite(out):
                    return out
    elif t is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(
        f"config key '{key.name}': expected {t.__name__}, got {type(value).__name__} {shown(value)}"
    )


class Config(Mapping[str, Value]):
    """A validated, immutable set of all config keys of its :class:`Schema`; read values as attributes
    (``cfg.alpha``)."""

    def __init__(self, values: Mapping[str, Value], schema: Schema):
        self._values = dict(values)
        self._schema = schema

    def __getattr__(self, name: str) -> Value:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            schema = self.__dict__.get("_schema")
            hint = schema.suggest(name) if schema is not None else ""
            raise AttributeError(f"no config key '{name}'{hint}") from None

    def __getitem__(self, name: str) -> Value:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self._values!r})"

    def replace(self, **changes: Any) -> "Config":
        """Return a new validated Config with ``changes`` applied."""
        return self._schema.build(changes, base=self._values)

    def defaults(self) -> dict[str, Value]:
        """Every key of this config's schema with its default."""
        return self._schema.defaults()

    def fingerprint_defaults(self) -> dict[str, Value]:
        """Every key of this config's schema with what the experiment fingerprint compares it with
        (:meth:`Schema.fingerprint_defaults`)."""
        return self._schema.fingerprint_defaults()

    def unread_keys(self) -> frozenset[str]:
        """The keys this run does not read (:meth:`Schema.unread_keys`)."""
        return self._schema.unread_keys(self._values)

    def to_dict(self) -> dict[str, Value]:
        """Plain dict of every key (JSON/TOML/Flower run-config compatible)."""
        return dict(self._values)

    def changed(self) -> dict[str, Value]:
        """The keys whose values differ from the schema's defaults: the same Config once the defaults are
        filled in again (what a simulated run's Flower run-config carries, since Flower keeps a copy of it
        per node)."""
        default = self.defaults()
        return {k: v for k, v in self._values.items() if k not in default or v != default[k]}


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans: only true/false are booleans, so that choices such as
    ``fedeagd_fusion: off`` or ``jdfl: off`` stay the strings they read as (YAML 1.1 makes on/off/yes/no
    booleans); a key given twice in one mapping is an error (PyYAML keeps the last one silently; a key a
    merge ``<<: *anchor`` brings is overridden by the mapping's own, as YAML says), and so are
    a list or mapping as a key and an integer of more digits than Python converts (PyYAML would raise a
    TypeError or ValueError, not a YAML error)."""

    def construct_mapping(self, node, deep=False):  # noqa: D102
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: the keys the node itself gives win
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (list, dict)):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a name, got a {type(key).__name__}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown(key)} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):  # noqa: D102
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(str(node.value))} characters is not a config value",
                node.start_mark) from None


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))

# A config or sweep file is a page of key: value lines; a larger file is a mistake (a data file given as
# the config), and reading 50 MB of YAML takes minutes and gigabytes before it can be refused.
MAX_CONFIG_BYTES = 1 << 20


def read_yaml_text(text: str) -> Any:
    """Parse YAML text the way every fedpers config is read (YAML 1.2 booleans, see ``_ConfigLoader``)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def read_config_file(path: str | Path, what: str = "config file") -> Any:
    """The parsed YAML of a config or sweep file (``what`` names it in errors); a missing, too large
    (over :data:`MAX_CONFIG_BYTES`), binary or malformed file is one ConfigError line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} not found: {p}")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {p} has {size:,} bytes; a {what} holds at most {MAX_CONFIG_BYTES:,} "
                          "(key: value lines, not data)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {p} is not a text file (not UTF-8): give a YAML file of key: value") from None
    if "\x00" in text:
        raise ConfigError(f"{what} {p} is not a text file (NUL bytes): give a YAML file of key: value")
    try:
        return read_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{what} {p} is not valid YAML{where}{f': {problem}' if problem else ''}") from None
    except RecursionError:  # brackets nested thousands deep
        raise ConfigError(f"{what} {p} nests too deep to be a config") from None


_NULLS = ("", "~", "null", "Null", "NULL")


def parse_set_value(raw: str) -> str:
    """The text of one ``--set key=VALUE``, whole: never cut at a ``#`` nor refused for a ``: `` (YAML would
    do both). Surrounding whitespace is dropped, a value in double quotes is read as a JSON string (what
    ``fedpers sweep`` passes its runs) and one in single quotes as YAML's (``'it''s'``), and ``null`` or
    ``~`` is empty. The key's type is applied by :func:`coerce_value` (``"0.5"``, ``"true"``, ``"3"``)."""
    text = raw.strip()
    if text in _NULLS:
        return ""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            value = json.loads(text)
        except ValueError:
            return text[1:-1]
        return value if isinstance(value, str) else text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


def parse_set_arguments(items: list[str]) -> dict[str, str]:
    """Parse CLI ``key=value`` strings into ``{key: text}`` (see :func:`parse_set_value`)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--set expects key=value, got {shown(item)}")
        out[name] = parse_set_value(raw)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML mapping of config keys; a missing or malformed file is a ConfigError."""
    p = Path(path)
    data = read_config_file(p)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must be a mapping of key: value, got {type(data).__name__}")
    for name, value in data.items():
        if isinstance(value, (list, dict)):
            raise ConfigError(f"config key {shown(str(name))} in {p}: expected a scalar, got {type(value).__name__}")
    return data


# client_layout=auto pools the clients of a simulation above this many: at 1,000 clients one SuperNode
# per client costs 35 s of start-up (one partition-id message per node), at 10,000 about 420 s and half a
# core of Flower's message polling (benchmarks/results/scale/); below it the node model costs little.
POOL_ABOVE_CLIENTS = 1000


def pooled(cfg: "Config") -> bool:
    """Whether the run's clients are served by a pool of nodes: ``client_layout`` as a simulation engine
    resolved it (:func:`simulated_layout`). A deployment never resolves ``auto``: there it means one client
    per SuperNode."""
    return str(cfg.client_layout) == "pool"


def pool_size(cfg: "Config") -> int:
    """SuperNodes of a pooled simulation: ``pool_nodes``, or the clients sampled per round; never more
    than there are clients."""
    wanted = int(cfg.pool_nodes) or clients_per_round(float(cfg.fraction_fit), int(cfg.num_clients))
    return max(1, min(wanted, int(cfg.num_clients)))


def simulated_layout(cfg: "Config") -> "Config":
    """``cfg`` as a simulation engine runs it: ``client_layout`` ``pool``, or ``auto`` above
    :data:`POOL_ABOVE_CLIENTS` clients, becomes ``pool`` with the client state on disk
    (``client_state_spill``: a partition may be served by another node, and so by another process, each
    time it is sampled)."""
    layout = str(cfg.client_layout)
    if layout == "pool" or (layout == "auto" and int(cfg.num_clients) > POOL_ABOVE_CLIENTS):
        return cfg.replace(client_layout="pool", client_state_spill=True)
    return cfg  # nodes, or auto below the threshold: one node per client (as `flwr run` runs it too)


def clients_per_round(fraction_fit: float, num_clients: int) -> int:
    """The clients sampled for fit in a round: ``round(fraction_fit * K)``, at least one (the paper's rho K)."""
    return max(1, int(round(fraction_fit * num_clients)))
