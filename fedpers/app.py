"""Deprecated path: the ServerApp moved to :mod:`fedpers.apps.server_app`. Kept because users name it in
places we cannot rewrite: ``fedpers.app:server_app`` in their own Flower app's pyproject, SuperExec or SuperNode
commands and scripts. Use ``fedpers.apps.server_app:server_app``."""

import warnings

from fedpers.apps.server_app import server_app  # noqa: F401  (the re-exported object)

warnings.warn("fedpers.app is deprecated: use fedpers.apps.server_app", DeprecationWarning, stacklevel=2)
