"""Deprecated path: the ClientApp moved to :mod:`fedpers.apps.client_app`. Kept because users name it in
places we cannot rewrite: ``fedpers.client_app:client_app`` in their own Flower app's pyproject, SuperExec or SuperNode
commands and scripts. Use ``fedpers.apps.client_app:client_app``."""

import warnings

from fedpers.apps.client_app import client_app  # noqa: F401  (the re-exported object)

warnings.warn("fedpers.client_app is deprecated: use fedpers.apps.client_app", DeprecationWarning, stacklevel=2)
