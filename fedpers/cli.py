"""Deprecated path: the command line moved to :mod:`fedpers.apps.cli`. Kept because users name it in
places we cannot rewrite: ``fedpers.cli:main`` in their own Flower app's pyproject, SuperExec or SuperNode
commands and scripts. Use ``fedpers.apps.cli:main``."""

import sys
import warnings

from fedpers.apps.cli import main  # noqa: F401  (the re-exported object)

warnings.warn("fedpers.cli is deprecated: use fedpers.apps.cli", DeprecationWarning, stacklevel=2)

if __name__ == "__main__":
    sys.exit(main())
