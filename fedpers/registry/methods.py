"""The one registry of methods (registry layer): name -> server Strategy class and client NumPyClient class.

Classes and key tables are named by import path: reading the registry imports no method, and a config
is validated against the methods' keys (``fedpers/algorithms/<method>.py:KEYS``, see :mod:`fedpers.registry.config`)
without importing Flower, a strategy or a client (the math modules import torch). A new method is one
entry here plus its files in ``strategies/``, ``clients/`` and ``fedpers/algorithms/`` (see "Adding a
method" in CONTRIBUTING.md).
What a method is judged by (``metric``) and the model it trains (``model_kind``) are declared by its
classes; ``needs_aux`` stays here because config validation reads it without importing them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    """How a method is built and judged."""

    name: str
    strategy: str  # "module:Class" of the server Strategy
    client: str  # "module:Class" of the NumPyClient
    keys: str = ""  # "module:NAME" of the method's own config keys (a tuple of fedpers.core.schema.Key); "" = none
    needs_aux: bool = False  # uses the server's labelled auxiliary set Ds
    paper: str = ""

    @property
    def metric(self) -> str:
        """Headline metric, as the strategy declares it: "global_acc" or "personalized_macro_acc"."""
        return self.strategy_class().metric

    def strategy_class(self) -> type:
        """Import and return the Strategy class."""
        return _import(self.strategy)

    def client_class(self) -> type:
        """Import and return the NumPyClient class."""
        return _import(self.client)

    def own_keys(self) -> tuple:
        """The method's own config keys (imports its math module; empty when it declares none)."""
        return tuple(_import(self.keys)) if self.keys else ()


@dataclass(frozen=True)
class ExtensionSpec:
    """A plug-in over some methods, switched on by the config key ``name`` (``off`` = not applied): two
    functions that wrap the method's Strategy and NumPyClient classes, and its own config keys."""

    name: str
    strategy_wrapper: str  # "module:function" taking and returning a Strategy class
    client_wrapper: str  # "module:function" taking and returning a NumPyClient class
    wraps: tuple[str, ...]  # the methods it can be applied to
    keys: str = ""
    paper: str = ""

    def applies(self, cfg) -> bool:
        """Whether the run's config switches the extension on."""
        return str(cfg.get(self.name, "off")) != "off"

    def own_keys(self) -> tuple:
        """The extension's own config keys (its switch included)."""
        return tuple(_import(self.keys)) if self.keys else ()


def _import(path: str):
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("fedavg", "strategies.fedavg:FedAvgStrategy", "clients.fedavg:FedAvgClient",
                   paper="McMahan et al., AISTATS 2017"),
        MethodSpec("fedprox", "strategies.fedprox:FedProxStrategy", "clients.fedprox:FedProxClient",
                   paper="Li et al., MLSys 2020"),
        MethodSpec("fedper", "strategies.fedper:FedPerStrategy", "clients.fedper:FedPerClient",
                   paper="Arivazhagan et al., arXiv:1912.00818"),
        MethodSpec("pfedkdh", "strategies.pfedkdh:PFedKDHStrategy", "clients.pfedkdh:PFedKDHClient",
                   keys="fedpers.algorithms.pfedkdh:KEYS",
                   needs_aux=True, paper="Souza Neto et al., MLSP 2026"),
        MethodSpec("fedeagd", "strategies.fedeagd:FedEAGDStrategy", "clients.fedeagd:FedEAGDClient",
                   keys="fedpers.algorithms.fedeagd:KEYS",
                   paper="FedEAGD (paper summary in shared/papers)"),
        MethodSpec("ditto", "strategies.ditto:DittoStrategy", "clients.ditto:DittoClient",
                   keys="fedpers.algorithms.ditto:KEYS",
                   paper="Li et al., ICML 2021"),
        MethodSpec("pfedme", "strategies.pfedme:PFedMeStrategy", "clients.pfedme:PFedMeClient",
                   keys="fedpers.algorithms.pfedme:KEYS",
                   paper="Dinh et al., NeurIPS 2020"),
        MethodSpec("fedrep", "strategies.fedrep:FedRepStrategy", "clients.fedrep:FedRepClient",
                   keys="fedpers.algorithms.fedrep:KEYS",
                   paper="Collins et al., ICML 2021"),
        MethodSpec("fedbabu", "strategies.fedbabu:FedBABUStrategy", "clients.fedbabu:FedBABUClient",
                   keys="fedpers.algorithms.fedbabu:KEYS",
                   paper="Oh et al., ICLR 2022"),
        MethodSpec("fedala", "strategies.fedala:FedALAStrategy", "clients.fedala:FedALAClient",
                   keys="fedpers.algorithms.fedala:KEYS",
                   paper="Zhang et al., AAAI 2023"),
        MethodSpec("fedproto", "strategies.fedproto:FedProtoStrategy", "clients.fedproto:FedProtoClient",
                   keys="fedpers.algorithms.fedproto:KEYS",
                   paper="Tan et al., AAAI 2022"),
        MethodSpec("pfedsim", "strategies.pfedsim:PFedSimStrategy", "clients.pfedsim:PFedSimClient",
                   keys="fedpers.algorithms.pfedsim:KEYS",
                   paper="Tan et al., arXiv:2305.15706"),
        MethodSpec("fedas", "strategies.fedas:FedASStrategy", "clients.fedas:FedASClient",
                   keys="fedpers.algorithms.fedas:KEYS",
                   paper="Yang et al., CVPR 2024"),
        MethodSpec("fedfed", "strategies.fedfed:FedFedStrategy", "clients.fedfed:FedFedClient",
                   keys="fedpers.algorithms.fedfed:KEYS",
                   paper="Yang et al., NeurIPS 2023"),
        # global federated optimizers (JDFL wraps them, see JDFL_BASES)
        MethodSpec("scaffold", "strategies.scaffold:ScaffoldStrategy", "clients.scaffold:ScaffoldClient",
                   keys="fedpers.algorithms.scaffold:KEYS",
                   paper="Karimireddy et al., ICML 2020"),
        MethodSpec("feddyn", "strategies.feddyn:FedDynStrategy", "clients.feddyn:FedDynClient",
                   keys="fedpers.algorithms.feddyn:KEYS",
                   paper="Acar et al., ICLR 2021"),
        MethodSpec("feddc", "strategies.feddc:FedDCStrategy", "clients.feddc:FedDCClient",
                   keys="fedpers.algorithms.feddc:KEYS",
                   paper="Gao et al., CVPR 2022"),
        MethodSpec("fedproc", "strategies.fedproc:FedProcStrategy", "clients.fedproc:FedProcClient",
                   keys="fedpers.algorithms.fedproc:KEYS",
                   paper="Mu et al., FGCS 2023"),
        MethodSpec("moon", "strategies.moon:MoonStrategy", "clients.moon:MoonClient",
                   keys="fedpers.algorithms.moon:KEYS",
                   paper="Li et al., CVPR 2021"),
    )
}

# JDFL (config ``jdfl: graded | random | hard``) is a mixin pair (strategies/jdfl.py, clients/jdfl.py)
# composed with the classes of a global optimizer whose client loss goes through
# ``FedPersClient.task_loss``; not a method of its own.
JDFL = ExtensionSpec("jdfl", "strategies.jdfl:with_jdfl", "clients.jdfl:with_jdfl",
                     wraps=("fedavg", "scaffold", "feddyn", "feddc", "fedproc", "moon"),
                     keys="fedpers.algorithms.jdfl:KEYS", paper="JDFL (paper in shared/papers)")
EXTENSIONS: tuple[ExtensionSpec, ...] = (JDFL,)
JDFL_BASES = JDFL.wraps


def get_method(name: str) -> MethodSpec:
    """Return the MethodSpec of ``name`` (the config schema has already checked the name)."""
    return METHODS[name]


def strategy_class_for(cfg) -> type:
    """The run's Strategy class: the method's, wrapped by each extension the config switches on (JDFL)."""
    cls = get_method(cfg.method).strategy_class()
    for extension in EXTENSIONS:
        if extension.applies(cfg):
            cls = _import(extension.strategy_wrapper)(cls)
    return cls


def client_class_for(cfg) -> type:
    """The run's NumPyClient class: the method's, wrapped by each extension the config switches on (JDFL)."""
    cls = get_method(cfg.method).client_class()
    for extension in EXTENSIONS:
        if extension.applies(cfg):
            cls = _import(extension.client_wrapper)(cls)
    return cls


def client_for_message(cfg, context):
    """The Flower ``Client`` that handles one message of the run on this node (``clients.base.message_client``
    of :func:`client_class_for`): the ClientApp's and the in-process engine's one way to build a client."""
    from clients.base import message_client

    return message_client(client_class_for(cfg), cfg, context)


def model_kind_of(cfg) -> str:
    """Model kind of the run (:func:`fedpers.core.models.model_kind_for`): ``cfg.model_kind`` when set, else
    the one the method's client declares (on ``dataset: synthetic`` its vector-data counterpart)."""
    from fedpers.core.models import model_kind_for

    return model_kind_for(str(cfg.get("model_kind", "")), client_class_for(cfg).model_kind, str(cfg.dataset))


def check_model_kind(cfg) -> None:
    """Refuse a model the run's method cannot train, in one line naming the key: a method whose own model has
    FedEAGD's gated residual branch given the plain ``mlp``, and a JDFL layer subset of convolutional blocks
    on a model without any (it would quietly be a smaller subset)."""
    from fedpers.core.errors import ConfigError
    from fedpers.core.models import CONV_FREE_KINDS, CONV_SUBSET_BLOCKS, RESIDUAL_KINDS

    kind, own = model_kind_of(cfg), client_class_for(cfg).model_kind
    if own in RESIDUAL_KINDS and kind == "mlp":
        raise ConfigError(f"config key 'model_kind': method {cfg.method} trains a gated residual branch, which "
                          f"model mlp has not: use residual_mlp")
    if JDFL.applies(cfg) and kind in CONV_FREE_KINDS and cfg.jdfl_layers in CONV_SUBSET_BLOCKS:
        raise ConfigError(f"config key 'jdfl_layers': {cfg.jdfl_layers} takes convolutional blocks, which model "
                          f"{kind} has none of: use jdfl_layers=head or all")


def federation_for(cfg):
    """The run's Federation (:func:`fedpers.core.federation.get_federation`), checked to hold the auxiliary set
    Ds when the method needs one (a partition file may leave none), after the run's model is checked to suit
    its method (:func:`check_model_kind`): the one check of data and model before a run starts."""
    from fedpers.core.errors import DataError
    from fedpers.core.federation import get_federation

    check_model_kind(cfg)
    fed = get_federation(cfg)
    if get_method(cfg.method).needs_aux and len(fed.partition.aux) == 0:
        source = f"partition file {cfg.partition_file}" if cfg.partition == "file" else "this split"
        raise DataError(f"method '{cfg.method}' needs the server's auxiliary set Ds, but {source} leaves none")
    return fed
