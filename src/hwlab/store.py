"""Writing files so that nothing already written is lost.

Every record hwlab writes (evidence, baselines, ceilings, incident records) goes through
:func:`write_json_atomic`: the data lands in a temporary file in the same folder, is
flushed to disk, and only then takes the final name. A crash leaves either the old file or
the new one, never half of each. By default an existing file is *not* replaced: replacing
a record must be asked for (``overwrite=True``).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class RecordExistsError(FileExistsError):
    """Refused to replace an existing record without ``overwrite=True``."""


def write_text_atomic(path: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically; refuse to replace an existing file unless asked."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise RecordExistsError(
            f"{path} already exists and was left untouched; choose another name or pass "
            "overwrite=True (--force on the command line) to replace it."
        )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; records are ordinary files
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            # link() fails if the name appeared meanwhile: no silent overwrite even in a race
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise RecordExistsError(f"{path} appeared while writing; left untouched") from None
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike, obj: Any, *, overwrite: bool = False) -> Path:
    """Serialise ``obj`` as indented JSON and write it with :func:`write_text_atomic`."""
    text = json.dumps(obj, indent=2, sort_keys=False, default=_default) + "\n"
    return write_text_atomic(path, text, overwrite=overwrite)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot store {type(o).__name__} in a JSON record")
