"""``python -m hwlab ...``: the same as the ``hwlab`` command."""
import sys

from hwlab.cli import main

sys.exit(main())
