"""Writing files so that nothing already written is lost.

Every record hwlab writes (evidence, baselines, ceilings, incident records) goes through
:func:`write_json_atomic`: the data lands in a temporary file in the same folder, is
flushed to disk, and only then takes the final name. A crash leaves either the old file or
the new one, never half of each. By default an existing file is *not* replaced: replacing
a record must be asked for (``overwrite=True``).

A command that measures and then writes checks its destination first
(:func:`check_destination`, :func:`check_folder`), so a bad path is refused before any
time is spent; if the write still fails afterwards (disk full, permissions changed), the
result goes to :func:`rescue_json` in the temp folder (:func:`write_or_rescue`) and the
caller prints that path.

Files the user names are read with :func:`read_user_text` / :func:`read_user_json`: a
folder, a missing, binary, unreadable, empty or truncated file is refused in one line that
says what to pass instead.

Records are strict JSON (RFC 8259): a non-finite float (``inf`` arithmetic intensity of a
probe that moves no bytes, ``nan`` of a zero time) is written as ``null``;
:func:`finite` also returns where and why, for output that can carry the reasons.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hwlab.errors import UserInputError


class RecordExistsError(FileExistsError, UserInputError):
    """Refused to replace an existing record without ``overwrite=True``."""


class DestinationError(UserInputError):
    """A place hwlab was asked to write to cannot take the file; nothing was measured yet."""


def _probe_writable(folder: Path) -> str | None:
    """Why ``folder`` cannot take a new file, or None. Creates and removes a temp file:
    ``os.access`` says yes to root on a read-only mount, a real create does not."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hwlab-write-check.", suffix=".tmp")
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    os.unlink(tmp)
    return None


def check_folder(folder: str | os.PathLike, *, what: str = "folder") -> Path:
    """Make sure ``folder`` exists (created with its parents if absent) and takes new files.

    Raises :class:`DestinationError` with one line saying what to do."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DestinationError(f"{what} {folder} is a file, not a folder: pass a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DestinationError(f"cannot create {what} {folder} ({e.strerror or e}): "
                               "choose a folder you can write to") from None
    why = _probe_writable(folder)
    if why:
        raise DestinationError(f"cannot write into {what} {folder} ({why}): "
                               "choose a folder you can write to")
    return folder


def check_destination(path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Check, before any measurement, that a record can be written to ``path``.

    Refuses (:class:`DestinationError`, one line) a path that is a folder, one that exists
    when ``overwrite`` is false (``--force``), or one whose folder cannot be created or
    written; creates a missing parent folder."""
    path = Path(path)
    if path.is_dir():
        raise DestinationError(f"{path} is a folder: give a file name (e.g. {path / 'record.json'})")
    if path.exists() and not overwrite:
        raise DestinationError(f"{path} already exists and was left untouched: choose another name "
                               "or pass --force to replace it")
    check_folder(path.parent if str(path.parent) else Path("."), what="folder")
    return path


def read_user_text(path: str | os.PathLike, what: str, hint: str, *,
                   error: type[UserInputError] = UserInputError) -> str:
    """The text of a file the user named, or ``error`` with one line saying what is wrong.

    Every file a command is given (evidence, observations, drills, grades, a saved topology)
    goes through here so the refusals read alike: ``what`` names the file in the message
    (``"evidence file"``) and ``hint`` says what to pass instead (``"pass an hwlab evidence
    .json"``). Refused: a folder, a missing file, binary data (not UTF-8), a file that cannot
    be read (permissions), an empty or whitespace-only file."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} {p} is a folder: {hint}")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist: check the path") from None
    except UnicodeDecodeError:
        raise error(f"{what} {p} is not text (binary data): {hint}") from None
    except PermissionError as e:
        raise error(f"cannot read {what} {p} ({e.strerror or e}): check its permissions") from None
    except OSError as e:  # e.g. a path through a file (Not a directory), an I/O error
        raise error(f"cannot read {what} {p} ({e.strerror or e}): {hint}") from None
    if not text.strip():
        raise error(f"{what} {p} is empty: {hint}")
    return text


def read_user_json(path: str | os.PathLike, what: str, hint: str, *,
                   error: type[UserInputError] = UserInputError) -> Any:
    """:func:`read_user_text` parsed as JSON; invalid JSON (often a truncated write) is refused
    with the line and column where parsing stopped."""
    text = read_user_text(path, what, hint, error=error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {Path(path)} is not valid JSON (line {e.lineno}, column {e.colno}: "
                    f"{e.msg}); it may be truncated: {hint}") from None


def write_or_rescue(write: Callable[[], Path], obj: Any, stem: str,
                    target: Path) -> tuple[Path | None, str | None]:
    """Run ``write()``; if it fails (after a measurement: the destination was checked before),
    keep ``obj`` in the rescue folder. Returns (written path, None) or (None, one line saying
    where the result went instead)."""
    try:
        return write(), None
    except OSError as e:
        fb = rescue_json(obj, stem)
        return None, (f"could not write {target} ({e.strerror or e}); the result was saved to "
                      f"{fb} instead")


def rescue_dir() -> Path:
    """Where results go when their destination failed after the measurement:
    ``$HWLAB_RESCUE_DIR`` or ``<temp>/hwlab-rescue``."""
    return Path(os.environ.get("HWLAB_RESCUE_DIR") or Path(tempfile.gettempdir()) / "hwlab-rescue")


def rescue_json(obj: Any, stem: str) -> Path:
    """Write ``obj`` to a new file in :func:`rescue_dir` (never over another) and return it."""
    folder = rescue_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        p = folder / f"{stem}-{stamp}{f'-{n}' if n else ''}.json"
        try:
            return write_json_atomic(p, obj)
        except RecordExistsError:
            continue
    raise RecordExistsError(f"{folder} has 1000 rescued {stem} records from this second")


def finite(obj: Any, where: str = "$", reasons: dict[str, str] | None = None) -> Any:
    """A copy of ``obj`` with every non-finite float replaced by None; ``reasons`` (if given)
    collects ``json path -> why`` for each replacement."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if reasons is not None:
            reasons[where] = (f"{obj!r} is not a JSON number: "
                              + ("undefined (e.g. a rate over zero time)" if math.isnan(obj)
                                 else "unbounded (e.g. FLOPs per byte of a probe that moves no bytes)"))
        return None
    if isinstance(obj, dict):
        return {k: finite(v, f"{where}.{k}", reasons) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, f"{where}[{i}]", reasons) for i, v in enumerate(obj)]
    return obj


def dumps_strict(obj: Any, *, reasons_key: str | None = "null_reasons") -> str:
    """Strict JSON for output: non-finite floats become null, and (for a dict at the top)
    ``reasons_key`` lists where and why, so a reader knows a null is not a missing probe."""
    obj = json.loads(json.dumps(obj, default=lambda o: _default_or_str(o)))  # plain types
    reasons: dict[str, str] = {}
    clean = finite(obj, "$", reasons)
    if reasons and reasons_key and isinstance(clean, dict):
        clean[reasons_key] = reasons
    return json.dumps(clean, indent=2, allow_nan=False)


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
    plain = json.loads(json.dumps(obj, default=_default))
    text = json.dumps(finite(plain), indent=2, sort_keys=False, allow_nan=False) + "\n"
    return write_text_atomic(path, text, overwrite=overwrite)


def _default_or_str(o: Any) -> Any:
    """Output (not records) may show anything: its printed form (a dtype, a device)."""
    try:
        return _default(o)
    except TypeError:
        return str(o)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    raise TypeError(f"cannot store {type(o).__name__} in a JSON record")
