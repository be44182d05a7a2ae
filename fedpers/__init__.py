"""fedpers: personalized federated learning on Flower (pFedKDH, FedEAGD, JDFL and baselines)."""

__version__ = "0.1.0"
