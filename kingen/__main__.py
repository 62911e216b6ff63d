"""``python -m kingen ...``: the same as the ``kingen`` command."""

import sys

from kingen.cli import main

if __name__ == "__main__":
    sys.exit(main())
