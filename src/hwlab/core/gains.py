"""How a change is said, one way everywhere: a gain in speed as "x% faster" or "x% slower", a change
in size (memory, bytes) as "x% less" or "x% more", never a signed figure beside a word that already
gives the direction ("-2.5% faster", "holds -34.3% of the memory").

Both take the signed figure the library computes (:func:`faster` a gain, positive = faster, e.g.
``100 * (1 - t_new / t_base)``; :func:`less_more` a change, positive = more, e.g.
``100 * (b_new / b_base - 1)``) and print its size with the word for its direction. A figure that
rounds to zero at the digits shown is said as no change in the positive word ("0.0% faster"), so a
rounding artefact never reads as a loss.
"""
from __future__ import annotations


def _size(pct: float, digits: int) -> tuple[str, bool]:
    text = f"{abs(pct):.{digits}f}"
    return text, pct < 0 and float(text) != 0.0


def faster(gain_pct: float, digits: int = 1) -> str:
    """``gain_pct`` (positive = faster) as "x% faster" or "x% slower"."""
    text, neg = _size(gain_pct, digits)
    return f"{text}% {'slower' if neg else 'faster'}"


def faster_from_change(change_pct: float, digits: int = 1) -> str:
    """A time *change* (positive = longer, e.g. a TPOT change vs a reference) as "x% faster/slower"."""
    return faster(-change_pct, digits)


def less_more(change_pct: float, digits: int = 1) -> str:
    """``change_pct`` of a size (positive = larger) as "x% more" or "x% less"."""
    text, neg = _size(change_pct, digits)
    return f"{text}% {'less' if neg else 'more'}"
