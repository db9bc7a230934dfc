"""``python -m hwlab.labs.bandwidth --ncu-case CASE``: launch one Lab 1 case once (an ncu target)."""
from hwlab.labs.bandwidth import _main

_main()
