"""Checking what a user hands to :func:`hwlab.examine.examine`: the inputs (tensors and plain
scalars on one device, never constant), the call (runs, returns a tensor), and that the call
leaves its inputs as they were. Each refusal is one :class:`~hwlab.errors.UserInputError` line
saying what to do; nothing is measured before these pass."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from hwlab.errors import UserInputError
from hwlab.core.measure import InputError, refuse_constant_inputs

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, complex)


def check_inputs(args: tuple, kwargs: dict) -> torch.device:
    leaves, _ = tree_flatten((args, kwargs))
    tensors = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif not isinstance(x, _SCALARS):
            raise UserInputError(
                f"input #{i} is a {type(x).__module__}.{type(x).__qualname__}: examine times tensors; "
                "pass torch tensors (e.g. torch.as_tensor(x, device='cuda')) and plain scalars only")
    if not tensors:
        raise UserInputError("no tensor among the inputs: examine needs the tensors the function works on "
                             "(pass them after the function, or an input factory: --inputs MODULE:FUNC)")
    devs = {str(t.device) for t in tensors}
    if "meta" in devs:  # shapes without storage: nothing runs, nothing to time
        raise UserInputError("an input is a meta tensor (shape only, no data): examine times real work; "
                             "create the inputs on 'cpu' or 'cuda'")
    if len(devs) > 1:
        raise UserInputError(f"inputs live on several devices ({', '.join(sorted(devs))}): move them to one")
    try:
        refuse_constant_inputs(tensors)
    except InputError as e:
        raise UserInputError(str(e)) from None
    return tensors[0].device


def fingerprint(tensors: list[torch.Tensor]) -> list[tuple[int, float]]:
    """(version counter, float64 sum) per tensor: an in-place op bumps the first, a write
    through ``.data`` or a raw pointer changes the second."""
    out = []
    with torch.no_grad():
        for t in tensors:
            x = t.detach().abs() if t.is_complex() else t.detach()
            out.append((t._version, torch.sum(x, dtype=torch.float64).item()))
    return out


def call(fn: Callable[..., Any], name: str, args: tuple, kwargs: dict):
    try:
        return fn(*args, **kwargs)
    except UserInputError:
        raise
    except Exception as e:  # the user's function failed: one line, nothing measured
        msg = " ".join(str(e).split())[:300]
        raise UserInputError(f"{name} raised {type(e).__name__}: {msg} (on the inputs given; fix the "
                             "function or its inputs, nothing was measured)") from None


def make(make_inputs: Callable[[], Any], where: str) -> tuple:
    try:
        a = make_inputs()
    except Exception as e:
        raise UserInputError(f"the input factory {where} raised {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}") from None
    if isinstance(a, torch.Tensor):
        return (a,)
    if not isinstance(a, (tuple, list)):
        raise UserInputError(f"the input factory {where} returned {type(a).__name__}: return a tuple "
                             "of the function's arguments (a single tensor is taken as one argument)")
    return tuple(a)
