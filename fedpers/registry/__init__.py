"""Registry layer: the methods (`methods.py`) and the validated config of a method (`config.py`).

Layers import one way: apps -> registry -> strategies/, clients/ -> fedpers.algorithms -> core
(tests/import_graph.py reads the layer from the folder)."""
