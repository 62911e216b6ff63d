"""``python -m kingen.cli``: the same as the ``kingen`` command."""

import sys

from kingen.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
