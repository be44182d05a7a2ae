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
    )
}


def get_method(name: str) -> MethodSpec:
    """Return the MethodSpec of ``name`` (the config schema has already checked the name)."""
    return METHODS[name]
