"""``python -m fedpers``: the same command line as the ``fedpers`` script (:mod:`fedpers.apps.cli`)."""

import sys

from fedpers.apps.cli import main

if __name__ == "__main__":
    sys.exit(main())
