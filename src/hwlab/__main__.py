"""``python -m hwlab ...``: the same as the ``hwlab`` command."""
import sys

from .cli import main

sys.exit(main())
