"""The one config schema of fedpers (core layer): YAML files, ``--set key=value`` overrides and Flower
run-config.

Every hyperparameter is a flat key with a type, a default, a range and a help text. The same names are
used in YAML, on the CLI (``fedpers run CFG --set alpha=0.5``) and in ``flwr run . --run-config``.
Defaults follow the pFedKDH paper's Table 1 (MNIST column) where the paper gives a value; values the
paper leaves out are marked "ours" in the help text and in docs/methods.md.

Nothing here knows the registered methods: :mod:`fedpers.config` adds the checks that do (the method's
name, what JDFL can wrap, which methods need Ds) on top of :func:`build_config`.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from fedpers.errors import ConfigError

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


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _at_least_one(v: int) -> str | None:
    return None if v >= 1 else "must be >= 1"


def _unit_interval_open_left(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _unit_interval_open(v: float) -> str | None:
    return None if 0 < v < 1 else "must be in (0, 1)"


def _unit_interval(v: float) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def _unit_interval_open_right(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _one_of(*choices: str) -> Callable[[str], str | None]:
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


KEYS: tuple[Key, ...] = (
    # --- what to run -------------------------------------------------------------------------
    Key("method", str, "pfedkdh", "federated method (see `fedpers methods`; checked by fedpers.config)"),
    Key("dataset", str, "mnist",
        "digits | mnist | fmnist | cifar10 | cifar100, or a path to a Keras-layout .npz file"),
    Key("data_dir", str, "",
        "directory holding <dataset>.npz or torchvision files; '' = ~/.cache/fedpers/data (download)"),
    Key("partition", str, "dirichlet",
        "client split: dirichlet | pathological | iid | file | domain (one domain per client, needs domain ids) "
        "| flwr (a flwr-datasets partitioner, see flwr_partitioner)",
        _one_of("dirichlet", "pathological", "iid", "file", "domain", "flwr")),
    Key("flwr_partitioner", str, "DirichletPartitioner",
        "partition=flwr: class name of a flwr_datasets.partitioner (e.g. PathologicalPartitioner, ShardPartitioner)"),
    Key("flwr_partitioner_args", str, "",
        "partition=flwr: its keyword arguments as a YAML mapping, e.g. '{alpha: 0.3}' (num_partitions, "
        "partition_by=label and seed are set unless given)"),
    Key("flwr_test_fraction", float, 0.25,
        "partition=flwr: share of each client's partition held out as its test split (ours: PFLlib's 75/25)",
        _unit_interval_open),
    Key("partition_file", str, "", "partition.npz to take clients, splits and Ds from (partition=file)"),
    Key("alpha", float, 0.05, "Dirichlet concentration of the class-wise label skew", _positive),
    Key("classes_per_client", int, 2, "classes per client for partition=pathological", _at_least_one),
    Key("min_samples_per_client", int, 10,
        "a Dirichlet draw is redone until every client has this many train samples (ours)", _at_least_one),
    Key("num_clients", int, 20, "number of clients K", _at_least_one),
    Key("fraction_fit", float, 0.5, "participation ratio rho: share of clients sampled per round",
        _unit_interval_open_left),
    Key("rounds", int, 50, "communication rounds R", _at_least_one),
    Key("local_epochs", int, 2, "local epochs E per round", _at_least_one),
    Key("batch_size", int, 64, "mini-batch size for local training and evaluation", _at_least_one),
    Key("lr", float, 0.015, "client SGD learning rate", _positive),
    Key("momentum", float, 0.0, "client SGD momentum (ours: plain SGD)", _unit_interval_open_right),
    Key("weight_decay", float, 0.0, "client SGD weight decay (ours)", _non_negative),
    Key("seed", int, 0, "seed of partitioning, model init, client sampling and training", _non_negative),
    Key("aux_size", int, 5000, "size of the server's labelled auxiliary set Ds (0 = none)", _non_negative),
    # --- model ---------------------------------------------------------------------------------
    Key("dropout", float, 0.25, "dropout rate of the CNN backbone (ours)", _unit_interval_open_right),
    Key("feature_dim", int, 512, "width of the backbone's FC projection = head input (ours, as PFLlib)",
        _at_least_one),
    # --- run mechanics -------------------------------------------------------------------------
    Key("eval_every", int, 1, "evaluate all clients every this many rounds (and at the last round)",
        _at_least_one),
    Key("device", str, "auto", "auto (CUDA when present) | cpu | cuda", _one_of("auto", "cpu", "cuda")),
    Key("client_cpus", float, 1.0, "CPUs per simulated client (Ray resources)", _positive),
    Key("client_gpus", float, 0.0, "GPUs per simulated client, fractional allowed (Ray resources)",
        _non_negative),
    Key("ray_address", str, "",
        "join this Ray cluster (HEAD_IP:PORT, see docs/running.md) instead of starting a private local Ray"),
    Key("out_dir", str, "results/latest", "where metrics.jsonl and summary.json are written"),
    Key("tensorboard", bool, False, "also write each round's metrics as TensorBoard events in out_dir/tensorboard"),
    Key("wandb", str, "off",
        "Weights & Biases logging of every round (optional extra fedpers[wandb]): off | offline (files in "
        "<out_dir>/wandb, `wandb sync` them later) | online", _one_of("off", "offline", "online")),
    Key("wandb_project", str, "fedpers", "Weights & Biases project name (wandb: offline | online)"),
    # --- robustness --------------------------------------------------------------------------------
    Key("aggregation", str, "mean",
        "rule for the shared part: mean (sample-weighted) | median | trimmed_mean (coordinate-wise)",
        _one_of("mean", "median", "trimmed_mean")),
    Key("trim_fraction", float, 0.1, "share cut from each end by aggregation=trimmed_mean",
        lambda v: None if 0 <= v < 0.5 else "must be in [0, 0.5)"),
    Key("max_update_samples", int, 0,
        "reject updates claiming more samples than this; 0 = the client's train size in the split",
        _non_negative),
    Key("min_fit_updates", int, 1, "a round with fewer valid updates stops the run with an error",
        _at_least_one),
    Key("faulty_clients", str, "",
        "fault injection: comma-separated partition ids whose updates are corrupted (robustness studies)",
        _id_list),
    Key("fault", str, "nan", "what faulty_clients send: nan (NaN arrays) | noise (update + N(0, 10^2))",
        _one_of("nan", "noise")),
    # --- pFedKDH (also FedProx's mu) ------------------------------------------------------------
    Key("variant", str, "fair", "pFedKDH evaluation variant: fair | ea", _one_of("fair", "ea")),
    Key("temperature", float, 3.0, "pFedKDH distillation temperature T (ours)", _positive),
    Key("lambda_kd", float, 0.5, "pFedKDH distillation weight lambda_KD (ours)", _unit_interval),
    Key("mu", float, 0.01, "proximal weight mu of pFedKDH Eq. 2 and FedProx (ours)", _non_negative),
    Key("recal_epochs", int, 3, "pFedKDH teacher-head recalibration epochs on Ds (Eq. 5)", _non_negative),
    Key("recal_every_round", bool, True,
        "pFedKDH: recalibrate the teacher head after every aggregation (Alg. 1 line 16); false keeps only "
        "the initial calibration of line 5 (the Fig. 3 '+KD' ablation without recurrent recalibration)"),
    Key("recal_lr", float, 0.015, "pFedKDH recalibration SGD learning rate (ours: = lr)", _positive),
    Key("warmup_epochs", int, 0, "pFedKDH global warm-up epochs E_w on Ds (Eq. 3)", _non_negative),
    Key("ea_steps", int, 10, "pFedKDH-EA head-only SGD steps at evaluation (ours)", _non_negative),
    Key("ea_lr", float, 0.015, "pFedKDH-EA head-adaptation learning rate (ours: = lr)", _positive),
    # --- FedEAGD (fedpers/algorithms/fedeagd.py; the summary gives no values for these except fixed_coef) ----------
    Key("fedeagd_ema_decay", float, 0.9,
        "FedEAGD EMA-teacher decay beta per participation: T <- beta T + (1-beta) theta_k (ours)", _unit_interval),
    Key("fedeagd_kd_base", float, 0.5, "FedEAGD base distillation coefficient lambda_0 (ours)", _non_negative),
    Key("fedeagd_kd_max", float, 1.0,
        "FedEAGD upper bound of the coefficient min(lambda_0 (1 + d), bound) (ours)", _non_negative),
    Key("fedeagd_kd_form", str, "cosine",
        "FedEAGD per-sample historical distillation loss: cosine (1 - cos) | mse (ours: cosine)",
        _one_of("cosine", "mse")),
    Key("fedeagd_fusion_start", int, 20, "FedEAGD round at which the residual gate starts to open (ours)",
        _non_negative),
    Key("fedeagd_fusion_ramp", int, 20, "FedEAGD rounds over which the gate rises linearly to 1 (ours)",
        _non_negative),
    Key("fedeagd_teacher", bool, True, "FedEAGD historical EMA teacher on (false = ablation: no teacher)"),
    Key("fedeagd_kd_weighting", str, "adaptive",
        "FedEAGD coefficient: adaptive (drift-based) | fixed (ablation, fedeagd_kd_fixed for every sample)",
        _one_of("adaptive", "fixed")),
    Key("fedeagd_kd_fixed", float, 0.5, "FedEAGD coefficient of the fixed-weighting ablation (summary: 0.50)",
        _non_negative),
    Key("fedeagd_fusion", str, "progressive",
        "FedEAGD residual fusion: progressive | always (ablation: on from round 0) | off (ablation)",
        _one_of("progressive", "always", "off")),
    # --- personalized baselines (fedpers/algorithms/): "paper" = the method's paper or code, "ours" = not given
    Key("ditto_lambda", float, 0.1,
        "Ditto lambda of the personal objective F_k(v) + lambda/2 ||v - w^t||^2 (ours, from the paper's grid "
        "0.05-2)", _non_negative),
    Key("ditto_personal_epochs", int, 0,
        "Ditto epochs of the personal-model update per round (s of Alg. 1); 0 = local_epochs (ours)",
        _non_negative),
    Key("pfedme_lambda", float, 15.0, "pFedMe regularisation lambda of the Moreau envelope (paper: 15)", _positive),
    Key("pfedme_k", int, 5, "pFedMe inner steps K on the personalized problem per mini-batch (paper: 5)",
        _at_least_one),
    Key("pfedme_personal_lr", float, 0.09,
        "pFedMe personal learning rate of the K inner steps (paper, MNIST non-convex: 0.09)", _positive),
    Key("pfedme_beta", float, 1.0, "pFedMe server step beta: w <- (1-beta) w + beta avg(w_i) (paper: 1)", _positive),
    Key("fedrep_head_epochs", int, 10,
        "FedRep head epochs per round with the body frozen (paper: 10); body epochs = local_epochs", _non_negative),
    Key("fedbabu_finetune_epochs", int, 5,
        "FedBABU whole-model fine-tuning epochs on train data before each evaluation (paper: 5)", _non_negative),
    Key("fedala_eta", float, 1.0, "FedALA learning rate eta of the ALA weights W (paper: 1.0)", _positive),
    Key("fedala_rand_percent", int, 80, "FedALA share s (%) of local train data used to learn W (paper: 80)",
        lambda v: None if 1 <= v <= 100 else "must be in 1..100"),
    Key("fedala_layer_idx", int, 2,
        "FedALA top parameter tensors aggregated with W, as FedALA's code counts them (paper: 2 = the head)",
        _at_least_one),
    Key("fedala_threshold", float, 0.01,
        "FedALA start phase: learn W until the std of the last fedala_num_pre_loss losses is below this "
        "(paper: 0.01; the authors' ALA module defaults to 0.1)", _positive),
    Key("fedala_num_pre_loss", int, 10, "FedALA start phase: losses in the convergence test (paper code: 10)",
        _at_least_one),
    Key("fedala_max_start_epochs", int, 100, "FedALA start phase: at most this many epochs (ours; FedALA: no cap)",
        _at_least_one),
    # --- deployment: client state on disk, server checkpoint/resume, round timeout (fedpers/deploy.py) ----
    Key("client_state_dir", str, "",
        "deployment: each client also writes its persistent state (heads, teachers, ...) atomically to "
        "<dir>/partition-<id>/ and restores it after a restart; '' = in memory only (node config "
        "'state-dir' overrides)"),
    Key("client_state_spill", bool, False,
        "keep per-client state (heads, EMA teachers, personal models, ...) only on disk in client_state_dir "
        "instead of in memory: memory no longer grows with the number of clients, at one file read and "
        "write per sampled client per round (fedpers run without client_state_dir uses a fresh "
        "<out_dir>/client_state-XXXXXXXX made for the run, removed when it ends; ours)"),
    Key("checkpoint_dir", str, "",
        "server checkpoint (global model, round, history) written atomically after every round; '' = none"),
    Key("resume", bool, False,
        "continue from the checkpoint in checkpoint_dir at its next round (metrics.jsonl keeps the done rounds)"),
    Key("overwrite", bool, False,
        "replace the run already in out_dir (summary.json, metrics.jsonl); without it such an out_dir is refused"),
    Key("round_timeout", float, 0.0,
        "seconds a round waits for client replies (Flower ServerConfig.round_timeout); 0 = no limit",
        _non_negative),
    Key("reply_poll_interval", float, 0.2,
        "seconds between the ServerApp's checks for client replies (ours; Flower's own Grid waits 3 s, which "
        "adds up to 3 s to every fit and evaluate phase of a deployed round)", _positive),
    Key("evaluate_with_next_fit", bool, True,
        "a client sampled again in the next round gets this round's evaluation in that fit message instead "
        "of an evaluate message of its own (same broadcast, same numbers: one message per client per round; "
        "the round's record is written when the next round's fit replies are in; ours, PFLlib's order). "
        "Methods whose fit broadcast is per client (pFedSim, FedFed) always send evaluate messages"),
    # --- JDFL and the global optimizers it wraps (fedpers/algorithms/) -----------------
    Key("model_kind", str, "",
        "model: '' = the method's own (cnn for most) | cnn | se_cnn | gn_cnn (JDFL paper's GroupNorm CNN)",
        _one_of("", "cnn", "se_cnn", "gn_cnn")),
    Key("jdfl", str, "off",
        "JDFL on top of the method (fedavg, scaffold, feddyn, feddc, fedproc, moon): off | graded | random | "
        "hard (ablation: expanded head, hard client-fixed joint labels)", _one_of("off", "graded", "random", "hard")),
    Key("jdfl_m", int, 0, "JDFL number of pseudo-domains M; 0 = chosen by jdfl_select", _non_negative),
    Key("jdfl_select", str, "elbow", "JDFL choice of M when jdfl_m = 0: elbow | silhouette (paper: elbow)",
        _one_of("elbow", "silhouette")),
    Key("jdfl_max_m", int, 10, "JDFL cap on M when it is chosen (paper: e.g. 10)", _at_least_one),
    Key("jdfl_alpha", float, 0.0,
        "JDFL graded main mass alpha; 0 = paper Sec. 5.5 (0.55 if M <= 5 else 0.45)", _unit_interval),
    Key("jdfl_tau", float, 0.1, "JDFL graded temperature tau of the centroid-cosine softmax (paper: 0.1)", _positive),
    Key("jdfl_phi", float, 1.0, "JDFL random: mass phi on the drawn joint unit j(d, c) (paper: 1.0)", _unit_interval),
    Key("jdfl_discovery_epochs", int, 3, "JDFL discovery local epochs E0 (paper: 3)", _at_least_one),
    Key("jdfl_discovery_batch", int, 0, "JDFL discovery batch size; 0 = batch_size", _non_negative),
    Key("jdfl_layers", str, "last_conv_head",
        "JDFL discovery update-vector layers: head | last_conv_head (paper) | last_two_conv_head | all",
        _one_of("head", "last_conv_head", "last_two_conv_head", "all")),
    Key("scaffold_server_lr", float, 1.0, "SCAFFOLD global step size eta_g (paper: 1)", _positive),
    Key("feddyn_alpha", float, 0.01, "FedDyn regularisation alpha (paper grid 0.1/0.01/0.001; ours 0.01)", _positive),
    Key("feddc_alpha", float, 0.01, "FedDC drift penalty alpha (FedDC code default 0.01)", _positive),
    Key("fedproc_tau", float, 0.5, "FedProc prototype-contrastive temperature (ours)", _positive),
    Key("moon_mu", float, 1.0, "MOON weight mu of the model-contrastive loss (paper: 1 or 5)", _non_negative),
    Key("moon_tau", float, 0.5, "MOON temperature tau (paper: 0.5)", _positive),
    # --- FedProto, pFedSim, FedAS, FedFed (fedpers/algorithms/); "code" = the authors' public code --
    Key("fedproto_lambda", float, 1.0,
        "FedProto weight lambda of the prototype term of Eq. 8 (paper code: ld = 1)", _non_negative),
    Key("fedproto_infer", str, "global",
        "FedProto inference: nearest global prototype (paper code) | nearest local prototype | head "
        "(the classifier); the other two are reported as extra metrics", _one_of("global", "local", "head")),
    Key("pfedsim_warmup", float, 0.5,
        "pFedSim share of rounds in the FedAvg warm-up phase before personalization (paper code: 0.5)",
        _unit_interval_open_right),
    Key("fedas_align_lr", float, 0.01, "FedAS parameter-alignment SGD learning rate (paper code: 0.01)", _positive),
    Key("fedas_align_epochs", int, 1, "FedAS parameter-alignment epochs (paper code: 1; 0 = no alignment)",
        _non_negative),
    Key("fedas_align_batch", int, 16, "FedAS parameter-alignment batch size (paper code: 16)", _at_least_one),
    Key("fedfed_distill_rounds", int, 15,
        "FedFed feature-distillation rounds (code: 15), counted inside `rounds`, at most rounds - 1 (ours)",
        _non_negative),
    Key("fedfed_vae_lr", float, 0.001, "FedFed distiller Adam learning rate (code: 1e-3)", _positive),
    Key("fedfed_noise_std1", float, 0.15, "FedFed std of the 1st Gaussian noise on shared features (code: 0.15)",
        _non_negative),
    Key("fedfed_noise_std2", float, 0.25, "FedFed std of the 2nd Gaussian noise on shared features (code: 0.25)",
        _non_negative),
    Key("fedfed_rec", float, 5.0, "FedFed weight of the distiller's reconstruction loss (code: 5.0)", _non_negative),
    Key("fedfed_kl", float, 0.005, "FedFed weight of the distiller's KL term (code: 0.005)", _non_negative),
    Key("fedfed_ce", float, 2.0, "FedFed weight of the CE on noisy sensitive features (code: 2.0)", _non_negative),
    Key("fedfed_x_ce", float, 0.4, "FedFed weight of the CE on raw inputs while distilling (code: 0.4)",
        _non_negative),
)

KEYS_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, list(KEYS_BY_NAME), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def coerce_value(key: Key, value: Any) -> Value:
    """Return ``value`` converted to ``key.type``, or raise ConfigError naming the key."""
    t = key.type
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
            return value.lower() in ("true", "yes", "on")
    elif t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"config key '{key.name}': must be a finite number, got {value!r}")
            return float(value)
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
        f"config key '{key.name}': expected {t.__name__}, got {type(value).__name__} {value!r}"
    )


class Config(Mapping[str, Value]):
    """A validated, immutable set of all config keys; read values as attributes (``cfg.alpha``)."""

    def __init__(self, values: Mapping[str, Value], checks: tuple[ValuesCheck, ...] = ()):
        self._values = dict(values)
        self._checks = checks

    def __getattr__(self, name: str) -> Value:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"no config key '{name}'{_suggest(name)}") from None

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
        return build_config(changes, base=self._values, checks=self._checks)

    def to_dict(self) -> dict[str, Value]:
        """Plain dict of every key (JSON/TOML/Flower run-config compatible)."""
        return dict(self._values)


def defaults() -> dict[str, Value]:
    """Every key with its schema default."""
    return {k.name: k.default for k in KEYS}


def build_config(overrides: Mapping[str, Any], base: Mapping[str, Value] | None = None,
                 checks: tuple[ValuesCheck, ...] = ()) -> Config:
    """Apply ``overrides`` on ``base`` (default: schema defaults), validate every key, then run ``checks``
    (each raises ConfigError), and return a Config.

    Raises ConfigError with one line naming the offending key for an unknown key (with the closest
    valid name), a wrong type or a value out of range.
    """
    values = dict(defaults() if base is None else base)
    for name, raw in overrides.items():
        key = KEYS_BY_NAME.get(name)
        if key is None:
            raise ConfigError(f"unknown config key '{name}'{_suggest(name)}")
        values[name] = coerce_value(key, raw)
    for check in checks[:1]:  # the method's name first: the other checks may depend on it
        check(values)
    for key in KEYS:
        if key.check is not None:
            problem = key.check(values[key.name])
            if problem:
                raise ConfigError(f"config key '{key.name}': {problem}, got {values[key.name]!r}")
    if values["partition"] == "file" and not values["partition_file"]:
        raise ConfigError("config key 'partition_file': partition=file needs partition_file: PATH")
    for check in checks[1:]:
        check(values)
    return Config(values, checks)


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans: only true/false are booleans, so that choices such as
    ``fedeagd_fusion: off`` or ``jdfl: off`` stay the strings they read as (YAML 1.1 makes on/off/yes/no
    booleans); and a key given twice in one mapping is an error (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):  # noqa: D102
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


def read_yaml_text(text: str) -> Any:
    """Parse YAML text the way every fedpers config is read (YAML 1.2 booleans, see ``_ConfigLoader``)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def parse_set_arguments(items: list[str]) -> dict[str, Any]:
    """Parse CLI ``key=value`` strings; values are read as YAML scalars (``0.5``, ``true``, ``'x'``)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        name, raw = item.split("=", 1)
        name = name.strip()
        try:
            value = read_yaml_text(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if value is None:
            value = ""
        if isinstance(value, (list, dict)):
            raise ConfigError(f"config key '{name}': expected a scalar, got {raw!r}")
        out[name] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML mapping of config keys; a missing or malformed file is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text file (not UTF-8): give a YAML file of key: value") from None
    if "\x00" in text:
        raise ConfigError(f"config file {p} is not a text file (NUL bytes): give a YAML file of key: value")
    try:
        data = read_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"config file {p} is not valid YAML{where}{f': {problem}' if problem else ''}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must be a mapping of key: value, got {type(data).__name__}")
    for name, value in data.items():
        if isinstance(value, (list, dict)):
            raise ConfigError(f"config key '{name}' in {p}: expected a scalar, got {type(value).__name__}")
    return data
