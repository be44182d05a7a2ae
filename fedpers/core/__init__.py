"""Core layer: configuration keys, data, partitions, models, training, results (no Flower app, no method).

Layers import one way: apps -> registry -> strategies/, clients/ -> fedpers.algorithms -> core
(tests/import_graph.py reads the layer from the folder)."""
