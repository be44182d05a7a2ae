"""The one registry of methods: name -> server Strategy class, client NumPyClient class, headline metric.

Classes are named by import path so that reading the registry (e.g. to validate a config) imports
neither Flower nor torch. A new method is one entry here plus one file in ``strategies/`` and one in
``clients/``.
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
    metric: str  # headline metric: "global_acc" (shared model) or "personalized_macro_acc"
    needs_aux: bool = False  # uses the server's labelled auxiliary set Ds
    paper: str = ""
    model: str = "cnn"  # model kind passed to fedpers.models.build_model ("cnn" | "se_cnn")

    def strategy_class(self) -> type:
        """Import and return the Strategy class."""
        return _import(self.strategy)

    def client_class(self) -> type:
        """Import and return the NumPyClient class."""
        return _import(self.client)


def _import(path: str) -> type:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("fedavg", "strategies.fedavg:FedAvgStrategy", "clients.fedavg:FedAvgClient",
                   "global_acc", paper="McMahan et al., AISTATS 2017"),
        MethodSpec("fedprox", "strategies.fedprox:FedProxStrategy", "clients.fedprox:FedProxClient",
                   "global_acc", paper="Li et al., MLSys 2020"),
        MethodSpec("fedper", "strategies.fedper:FedPerStrategy", "clients.fedper:FedPerClient",
                   "personalized_macro_acc", paper="Arivazhagan et al., arXiv:1912.00818"),
        MethodSpec("pfedkdh", "strategies.pfedkdh:PFedKDHStrategy", "clients.pfedkdh:PFedKDHClient",
                   "personalized_macro_acc", needs_aux=True, paper="Souza Neto et al., MLSP 2026"),
        MethodSpec("fedeagd", "strategies.fedeagd:FedEAGDStrategy", "clients.fedeagd:FedEAGDClient",
                   "personalized_macro_acc", paper="FedEAGD (paper summary in shared/papers)", model="se_cnn"),
        MethodSpec("ditto", "strategies.ditto:DittoStrategy", "clients.ditto:DittoClient",
                   "personalized_macro_acc", paper="Li et al., ICML 2021"),
        MethodSpec("pfedme", "strategies.pfedme:PFedMeStrategy", "clients.pfedme:PFedMeClient",
                   "personalized_macro_acc", paper="Dinh et al., NeurIPS 2020"),
        MethodSpec("fedrep", "strategies.fedrep:FedRepStrategy", "clients.fedrep:FedRepClient",
                   "personalized_macro_acc", paper="Collins et al., ICML 2021"),
        MethodSpec("fedbabu", "strategies.fedbabu:FedBABUStrategy", "clients.fedbabu:FedBABUClient",
                   "personalized_macro_acc", paper="Oh et al., ICLR 2022"),
        MethodSpec("fedala", "strategies.fedala:FedALAStrategy", "clients.fedala:FedALAClient",
                   "personalized_macro_acc", paper="Zhang et al., AAAI 2023"),
        MethodSpec("fedproto", "strategies.fedproto:FedProtoStrategy", "clients.fedproto:FedProtoClient",
                   "personalized_macro_acc", paper="Tan et al., AAAI 2022"),
        MethodSpec("pfedsim", "strategies.pfedsim:PFedSimStrategy", "clients.pfedsim:PFedSimClient",
                   "personalized_macro_acc", paper="Tan et al., arXiv:2305.15706"),
        MethodSpec("fedas", "strategies.fedas:FedASStrategy", "clients.fedas:FedASClient",
                   "personalized_macro_acc", paper="Yang et al., CVPR 2024"),
        MethodSpec("fedfed", "strategies.fedfed:FedFedStrategy", "clients.fedfed:FedFedClient",
                   "personalized_macro_acc", paper="Yang et al., NeurIPS 2023"),
        # global federated optimizers (issue 4; JDFL wraps them, see JDFL_BASES)
        MethodSpec("scaffold", "strategies.scaffold:ScaffoldStrategy", "clients.scaffold:ScaffoldClient",
                   "global_acc", paper="Karimireddy et al., ICML 2020"),
        MethodSpec("feddyn", "strategies.feddyn:FedDynStrategy", "clients.feddyn:FedDynClient",
                   "global_acc", paper="Acar et al., ICLR 2021"),
        MethodSpec("feddc", "strategies.feddc:FedDCStrategy", "clients.feddc:FedDCClient",
                   "global_acc", paper="Gao et al., CVPR 2022"),
        MethodSpec("fedproc", "strategies.fedproc:FedProcStrategy", "clients.fedproc:FedProcClient",
                   "global_acc", paper="Mu et al., FGCS 2023"),
        MethodSpec("moon", "strategies.moon:MoonStrategy", "clients.moon:MoonClient",
                   "global_acc", paper="Li et al., CVPR 2021"),
    )
}

# Methods that the JDFL extension (config ``jdfl: graded | random | hard``) can wrap: global optimizers
# whose client loss goes through ``FedPersClient.task_loss``. JDFL itself is a mixin pair
# (strategies/jdfl.py, clients/jdfl.py) composed with the method's classes, not a method of its own.
JDFL_BASES = ("fedavg", "scaffold", "feddyn", "feddc", "fedproc", "moon")


def get_method(name: str) -> MethodSpec:
    """Return the MethodSpec of ``name`` (the config schema has already checked the name)."""
    return METHODS[name]


def _jdfl_on(cfg) -> bool:
    return str(cfg.get("jdfl", "off")) != "off"


def strategy_class_for(cfg) -> type:
    """The run's Strategy class: the method's, wrapped by JDFL when ``cfg.jdfl`` is not ``off``."""
    cls = get_method(cfg.method).strategy_class()
    if _jdfl_on(cfg):
        from strategies.jdfl import with_jdfl

        cls = with_jdfl(cls)
    return cls


def client_class_for(cfg) -> type:
    """The run's NumPyClient class: the method's, wrapped by JDFL when ``cfg.jdfl`` is not ``off``."""
    cls = get_method(cfg.method).client_class()
    if _jdfl_on(cfg):
        from clients.jdfl import with_jdfl

        cls = with_jdfl(cls)
    return cls


def model_kind_of(cfg) -> str:
    """Model kind of the run: ``cfg.model_kind`` when set, else the method's own."""
    return str(cfg.get("model_kind", "")) or get_method(cfg.method).model
