"""Resolve ``MODULE:FUNC`` (a dotted module or a path to a ``.py`` file) to a callable, for
``hwlab examine`` and its Nsight Compute child process. Bad specs raise
:class:`~hwlab.errors.UserInputError` with one line saying what to pass."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

from hwlab.errors import UserInputError
from hwlab.core.store import check_input_file


def _module(spec: str):
    if spec.endswith(".py") or "/" in spec:
        path = _shipped_example(Path(spec))
        check_input_file(path, "module file", "pass MODULE:FUNC with a dotted module or a .py path")
        mod_name = f"hwlab_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = mod
        sys.path.insert(0, str(path.resolve().parent))  # its own siblings import as they would
        try:
            loader_spec.loader.exec_module(mod)
        except SystemExit as e:
            del sys.modules[mod_name]
            raise UserInputError(_exited(spec, e)) from None
        except Exception as e:
            del sys.modules[mod_name]
            raise UserInputError(f"importing {spec} raised {type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:200]}") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
        return mod
    # the current folder first, as `python -c` and `python -m` put it (a console script does not)
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(spec)
    except SystemExit as e:
        sys.modules.pop(spec, None)
        raise UserInputError(_exited(spec, e)) from None
    except ImportError as e:
        raise UserInputError(f"cannot import {spec!r} ({e}) from {here} or the import path: pass an "
                             "importable module or a .py path") from None
    except Exception as e:
        raise UserInputError(f"importing {spec} raised {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}") from None
    finally:
        if added:
            sys.path.remove(here)


def _shipped_example(path: Path) -> Path:
    """``examples/NAME.py`` where no such file is here: the example the package ships (the front
    door and the docs name them so; from outside the checkout the folder is not beside you)."""
    if path.exists() or path.parts[:1] != ("examples",) or len(path.parts) != 2:
        return path
    from hwlab.core.evidence import EXAMPLES_DIR

    shipped = EXAMPLES_DIR / path.name
    return shipped if shipped.is_file() else path


def _exited(spec: str, e: SystemExit) -> str:
    return (f"importing {spec} called sys.exit({e.code!r}): nothing was measured; put the module's "
            "script code under `if __name__ == \"__main__\":` so it can be imported")


def load(target: str, what: str = "function") -> tuple[Callable[..., Any], Any]:
    """(callable, its module) for ``MODULE:FUNC``; FUNC may be dotted (Class.method)."""
    if ":" not in target:
        raise UserInputError(f"{target!r}: give the {what} as MODULE:FUNC (e.g. examples/gather.py:shuffled_gather)")
    mod_spec, attr = target.rsplit(":", 1)
    mod = _module(mod_spec)
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            have = sorted(n for n in dir(mod) if callable(getattr(mod, n, None)) and not n.startswith("_"))
            raise UserInputError(f"{mod_spec} has no {attr!r} (callables there: {', '.join(have[:12]) or 'none'})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserInputError(f"{target} is a {type(obj).__name__}, not a {what}: pass a callable")
    return obj, mod


def load_model(target: str) -> tuple[Callable[..., Any], tuple, Callable[[], Any] | None]:
    """(module or bound method, argument tuple, input factory or None) from a factory
    ``MODULE:FACTORY`` returning ``(module, inputs)``; ``inputs`` is an argument tuple (a single
    tensor is one argument) or a function returning one (then called for fresh sets)."""
    factory, _ = load(target, "model factory")
    try:
        got = factory()
    except Exception as e:
        raise UserInputError(f"the model factory {target} raised {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}") from None
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and callable(got[0])):
        raise UserInputError(f"the model factory {target} returned {type(got).__name__}: return "
                             "(module, inputs), inputs an argument tuple or a function returning one")
    module, inputs = got
    if callable(inputs) and not hasattr(inputs, "shape"):
        return module, (), inputs
    return module, (inputs,) if hasattr(inputs, "shape") else tuple(inputs), None
