"""Errors that mean "the user gave something we cannot use" (exit code 2 on the command line).

Core floor: imports nothing from hwlab. Every module may raise :class:`UserInputError` with one
line that says what is wrong and what to do; the CLI prints that line (no traceback) and exits 2.
"""
from __future__ import annotations

EXIT_OK = 0        # ran, nothing found
EXIT_FINDING = 1   # ran, found something: unhealthy verdict, deviation, failed grade
EXIT_USAGE = 2     # bad input or usage: nothing was measured or written
EXIT_INTERNAL = 3  # a bug in hwlab: please report it with the traceback
EXIT_UNDECIDED = 4  # ran, but the flowchart walk stopped at a question its evidence cannot answer
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (``| head``): 128 + SIGPIPE, as a C tool ends


class UserInputError(ValueError):
    """Bad input from the user: the message is one line saying what to do."""
