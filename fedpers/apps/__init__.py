"""Apps layer: the CLI, Flower's ServerApp/ClientApp, the simulation and in-process engines, deployment, sweeps and reports.

Layers import one way: apps -> registry -> strategies/, clients/ -> fedpers.algorithms -> core
(tests/import_graph.py reads the layer from the folder)."""
