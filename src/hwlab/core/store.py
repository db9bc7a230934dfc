"""Writing files so that nothing already written is lost.

Every record hwlab writes (evidence, baselines, ceilings, incident records) goes through
:func:`write_json_atomic`: the data lands in a temporary file in the same folder, is
flushed to disk, and only then takes the final name. A crash leaves either the old file or
the new one, never half of each. By default an existing file is *not* replaced: replacing
a record must be asked for (``overwrite=True``).

A command that measures and then writes checks its destination first
(:func:`check_destination`, :func:`check_folder`), so a bad path is refused before any
time is spent; if the write still fails afterwards (disk full, permissions changed), the
result goes to the rescue folder (:func:`write_or_rescue`, :func:`rescue`) and the caller
prints that path, or, when the rescue folder fails too, that the printed result is the only
copy.

Files the user names are read with :func:`read_user_text` / :func:`read_user_json`: a
folder, a missing, binary, unreadable, empty or truncated file is refused in one line that
says what to pass instead. Before anything is opened, :func:`check_input_file` refuses what
is not a regular file (a FIFO would block the reader, a device such as ``/dev/zero`` never
ends) and a file over :data:`MAX_INPUT_BYTES`; files found inside a folder (a run's step
logs, a class folder) pass the same check.

Records are strict JSON (RFC 8259): a non-finite float (``inf`` arithmetic intensity of a
probe that moves no bytes, ``nan`` of a zero time) is written as ``null``;
:func:`finite` also returns where and why, for output that can carry the reasons.
"""
from __future__ import annotations

import errno
import json
import math
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


def _stat_dest(path: Path) -> os.stat_result | None:
    """``os.stat(path)``, None when nothing is there; a path that cannot be looked at (a
    symlink loop, a path through a file) is refused in one line naming the cause."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DestinationError(f"{path} is a symbolic link that loops back on itself: give a "
                                   "real file name") from None
        if e.errno == errno.ENOTDIR:
            raise DestinationError(f"{path} lies under a file: a folder on its way is a file, not a folder; "
                                   "give a path in a folder") from None
        if e.errno == errno.ENAMETOOLONG:
            raise DestinationError(f"{str(path)[:60]}... is a name too long for this file system "
                                   f"({len(path.name)} characters): give a shorter one") from None
        raise DestinationError(f"cannot look at {path} ({e.strerror or e}): choose a path you can "
                               "write to") from None


def check_destination(path: str | os.PathLike, *, overwrite: bool = False,
                      inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Check, before any measurement or reading, that a file can be written to ``path``.

    Refused (:class:`DestinationError`, one line), ``--force`` or not: a folder; anything that is
    not a regular file (a device such as ``/dev/null``, a FIFO, a socket: an atomic replace would
    swap the node for a plain file, a direct write would feed the device); the same file as one
    of ``inputs`` (compared by device and inode, so another name or a link of the input counts):
    replacing it would lose what the command reads. Refused without ``overwrite``: an existing
    regular file. A missing parent folder is created; one that takes no new file is refused."""
    path = Path(path)
    st = _stat_dest(path)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise DestinationError(f"{path} is a folder: give a file name (e.g. {path / 'record.json'})")
        kind = _not_regular(st.st_mode)
        if kind:
            raise DestinationError(f"{path} is {kind}, not a regular file: hwlab writes only regular files "
                                   "and never replaces anything else, --force or not; give a file name")
        for src in inputs:
            try:
                sst = os.stat(src)
            except OSError:
                continue
            if (sst.st_dev, sst.st_ino) == (st.st_dev, st.st_ino):
                raise DestinationError(f"{path} is the input {src} itself: writing there would replace "
                                       "what is being read, --force or not; give another file name")
        if not overwrite:
            raise DestinationError(f"{path} already exists and was left untouched: choose another name "
                                   "or pass --force to replace it")
    check_folder(path.parent if str(path.parent) else Path("."), what="folder")
    return path


#: the largest file a command reads whole (records, observations, drills, topologies, logs
#: read into memory): the kit's own records are kilobytes, a long step log megabytes; a file
#: past this is not one of them (a disk image, /dev/zero), and reading it would exhaust memory
MAX_INPUT_BYTES = 256 * 2**20

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO (named pipe)", ...), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_input_file(path: str | os.PathLike, what: str, hint: str, *,
                     max_bytes: int = MAX_INPUT_BYTES,
                     error: type[UserInputError] = UserInputError) -> Path:
    """``path`` if it is a regular file of at most ``max_bytes``, else ``error`` in one line.

    Every path a command reads goes through here (or :func:`read_user_bytes`, which calls it)
    *before* it is opened: a FIFO would block the reader forever and a device (``/dev/zero``)
    never ends, so both are refused from ``stat`` alone; a folder, a missing or unreadable
    path and a file over ``max_bytes`` are refused too, each saying what to pass instead."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist: check the path") from None
    except PermissionError as e:
        raise error(f"cannot read {what} {p} ({e.strerror or e}): check its permissions") from None
    except OSError as e:  # a path through a file (Not a directory), a symlink loop
        raise error(f"cannot read {what} {p} ({e.strerror or e}): {hint}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {p} is a folder: {hint}")
    kind = _not_regular(st.st_mode)
    if kind:
        raise error(f"{what} {p} is {kind}, not a regular file: save it to a file first, then {hint}")
    if st.st_size > max_bytes:
        raise error(f"{what} {p} is {st.st_size / 2**20:,.0f} MiB, more than the "
                    f"{max_bytes / 2**20:,.0f} MiB hwlab reads: {hint}")
    return p


def check_input_folder(path: str | os.PathLike, what: str, hint: str, *,
                       error: type[UserInputError] = UserInputError) -> Path:
    """``path`` if it is a folder, else ``error`` in one line (a FIFO or a file named where a
    folder is expected is refused without being opened)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist: {hint}") from None
    except OSError as e:
        raise error(f"cannot read {what} {p} ({e.strerror or e}): {hint}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {p} is not a folder ({_not_regular(st.st_mode) or 'a file'}): {hint}")
    return p


def read_user_bytes(path: str | os.PathLike, what: str, hint: str, *,
                    max_bytes: int = MAX_INPUT_BYTES,
                    error: type[UserInputError] = UserInputError) -> bytes:
    """The bytes of a file the user named, checked by :func:`check_input_file` first and
    opened non-blocking, so a path swapped for a FIFO between the check and the open still
    cannot block; at most ``max_bytes`` are read."""
    p = check_input_file(path, what, hint, max_bytes=max_bytes, error=error)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except PermissionError as e:
        raise error(f"cannot read {what} {p} ({e.strerror or e}): check its permissions") from None
    except OSError as e:
        raise error(f"cannot read {what} {p} ({e.strerror or e}): {hint}") from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind:
            raise error(f"{what} {p} is {kind}, not a regular file: save it to a file first, then {hint}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:  # e.g. an I/O error
        raise error(f"cannot read {what} {p} ({e.strerror or e}): {hint}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{what} {p} grew past the {max_bytes / 2**20:,.0f} MiB hwlab reads: {hint}")
    return data


def read_user_text(path: str | os.PathLike, what: str, hint: str, *,
                   error: type[UserInputError] = UserInputError,
                   max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of a file the user named, or ``error`` with one line saying what is wrong.

    Every file a command is given (evidence, observations, drills, grades, a saved topology)
    goes through here so the refusals read alike: ``what`` names the file in the message
    (``"evidence file"``) and ``hint`` says what to pass instead (``"pass an hwlab evidence
    .json"``). Refused: what :func:`check_input_file` refuses (a folder, a missing file, a
    FIFO, a device, a file over ``max_bytes``), binary data (not UTF-8), a file that cannot
    be read (permissions), an empty or whitespace-only file."""
    p = Path(path)
    data = read_user_bytes(p, what, hint, max_bytes=max_bytes, error=error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {p} is not text (binary data): {hint}") from None
    if not text.strip():
        raise error(f"{what} {p} is empty: {hint}")
    return text


def read_user_json(path: str | os.PathLike, what: str, hint: str, *,
                   error: type[UserInputError] = UserInputError) -> Any:
    """:func:`read_user_text` parsed by :func:`loads_user_json`; what it refuses (invalid JSON,
    often a truncated write, with the line and column where parsing stopped; nesting or an
    integer no record holds) is refused in one line naming the file and what to pass instead."""
    text = read_user_text(path, what, hint, error=error)
    try:
        return loads_user_json(text)
    except UserJSONError as e:
        raise error(f"{what} {Path(path)} {e}: {hint}") from None


class UserJSONError(UserInputError):
    """JSON hwlab did not write that it will not read; the message completes "FILE ..."."""


def loads_user_json(text: str) -> Any:
    """Parse JSON that came from outside this process (a file, one line of a step log): the one
    parser for users' JSON, so every reader refuses the same things in the same words.

    Refused with :class:`UserJSONError`: invalid JSON (with line and column), nesting deeper than
    :data:`MAX_JSON_DEPTH`, and an integer of more than :data:`MAX_INT_DIGITS` digits (no float
    holds it, and past Python's 4,300-digit limit it cannot even be converted). NaN and Infinity
    parse (as Python's json does), so the number checks of :mod:`hwlab.core.validate` can name
    the field that holds them."""
    try:
        obj = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise UserJSONError(f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                            "it may be truncated") from None
    except RecursionError:  # nested past the parser's own stack
        raise UserJSONError(_DEEP) from None
    if _depth_over(obj, MAX_JSON_DEPTH):
        raise UserJSONError(_DEEP)
    return obj


#: the most digits an integer in users' JSON may have: 309 digits is past the largest float
#: (1.8e308), so no number hwlab computes with can be that large
MAX_INT_DIGITS = 308


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise UserJSONError(f"holds an integer of {digits:,} digits (more than {MAX_INT_DIGITS}, past any "
                            "value hwlab reads)")
    return int(text)


#: nesting of JSON the readers accept: the kit's records nest at most about a dozen levels, and the
#: recursive walks that print, copy and migrate a record exhaust Python's stack near a thousand
MAX_JSON_DEPTH = 64
_DEEP = (f"is nested deeper than {MAX_JSON_DEPTH} levels: no file hwlab reads nests so deep "
         "(is it the right file?)")


def _depth_over(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests containers more than ``limit`` deep (walked without recursion)."""
    todo = [(obj, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                return True
            todo.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


def write_or_rescue(write: Callable[[], Path], obj: Any, stem: str, target: Path, *,
                    lost: str = "the result printed is the only copy") -> tuple[Path | None, str | None]:
    """Run ``write()``; if it fails (after a measurement: the destination was checked before),
    keep ``obj`` in the rescue folder. Returns (written path, None) or (None, one line saying
    where the result went instead, or ``lost`` when the rescue folder fails too)."""
    try:
        return write(), None
    except OSError as e:
        return None, rescue(obj, stem, target, e, lost=lost)


def rescue(obj: Any, stem: str, target: str | os.PathLike, e: OSError, *,
           suffix: str = ".json", write: Callable[[Path], Any] | None = None,
           lost: str = "the result printed is the only copy") -> str:
    """Keep a result whose write to ``target`` failed with ``e`` in the rescue folder and
    return the one line to print: where it went, or, if the rescue folder fails too, ``lost``
    (by default: that the printed result is the only copy). ``obj`` is written as JSON, or
    (``write`` given) ``write`` is called with a new free path ending in ``suffix`` (a plot, an
    archive); a file it leaves unfinished is removed."""
    fb = None
    try:
        if write is None:
            fb = rescue_json(obj, stem)
        else:
            fb = rescue_path(stem, suffix)
            write(fb)
    except OSError as e2:
        if write is not None and fb is not None:
            _remove(fb)
        return (f"could not write {target} ({e.strerror or e}), nor keep it in {rescue_dir()} "
                f"({e2.strerror or e2}): {lost}")
    return f"could not write {target} ({e.strerror or e}); the result was saved to {fb} instead"


def rescue_path(stem: str, suffix: str) -> Path:
    """A new, unused path in :func:`rescue_dir` (``<stem>-<UTC time>[-n]<suffix>``), its
    folder created; the name is reserved by creating the file empty."""
    folder = rescue_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        p = folder / f"{stem}-{stamp}{f'-{n}' if n else ''}{suffix}"
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return p
        except FileExistsError:
            continue
    raise RecordExistsError(f"{folder} has 1000 rescued {stem} files from this second")


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
    """Write ``text`` to ``path`` atomically; refuse to replace an existing file unless asked,
    and never replace anything but a regular file (:func:`publish`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise RecordExistsError(
            f"{path} already exists and was left untouched; choose another name or pass "
            "overwrite=True (--force on the command line) to replace it."
        )
    with temp_beside(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path, overwrite=overwrite)
    return path


def write_atomic_with(path: str | os.PathLike, write: Callable[[Path], Any], *, overwrite: bool = False,
                      suffix: str = ".tmp") -> Path:
    """``write(tmp)`` fills a temporary file beside ``path`` (ending in ``suffix``: a plotting
    library picks the format from it), then it takes the name (:func:`publish`): a plot or any
    file another library writes lands as atomically as a record."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise RecordExistsError(f"{path} already exists and was left untouched; choose another name or "
                                "pass --force to replace it")
    with temp_beside(path, suffix) as tmp:
        write(tmp)
        publish(tmp, path, overwrite=overwrite)
    return path


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP, SIGINT's kin from a closing terminal) arrived while a file was being
    written: the temporary file is removed and the process ends with 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextmanager
def temp_beside(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """A new temporary file in ``path``'s folder (mode as a plain ``open`` would make it), removed
    if anything goes wrong before the caller :func:`publish`-es it: an exception, Ctrl-C, or
    SIGTERM / SIGHUP, which while the block runs (in the main thread) stop the write, remove the
    temporary file and say on stderr what was kept; the process then ends with 128 + signal."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _remove_stale(folder, f".{path.name[:100]}.", suffix)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:100]}.", suffix=suffix)
    os.close(fd)
    old: dict[int, Any] = {}

    def stop(signum, frame):
        raise Terminated(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                try:
                    old[sig] = signal.signal(sig, stop)
                except (ValueError, OSError):
                    pass
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; records are ordinary files
        yield Path(tmp)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, Terminated):
            kept = (f"{path} was left as it was" if path.exists() else f"{path} was not written")
            print(f"hwlab: stopped by {signal.Signals(e.signum).name} while writing {path}: the partial "
                  f"file was removed and {kept}", file=sys.stderr, flush=True)
        raise
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        _remove(tmp)  # published: the name is gone already (link then unlink, or replace)


#: a temporary file of ours older than this (s) beside a target is a write that was killed
#: (SIGKILL, a power cut: no handler runs); no write of a record or an archive takes an hour
STALE_TEMP_S = 3600.0


def _remove_stale(folder: Path, prefix: str, suffix: str) -> None:
    """Remove the temporary files a killed write of the same target left (named as
    :func:`temp_beside` names them, older than :data:`STALE_TEMP_S`)."""
    import glob
    import time

    now = time.time()
    for p in folder.glob(glob.escape(prefix) + "*" + glob.escape(suffix)):
        try:
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_TEMP_S and len(p.name) == len(prefix) + 8 + len(suffix):
                p.unlink()
        except OSError:
            continue


def _remove(p: str | os.PathLike) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def publish(tmp: str | os.PathLike, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Give the finished temporary file ``tmp`` (in ``path``'s folder) its name in one step.
    Without ``overwrite``, link() fails if the name appeared meanwhile: no silent overwrite even
    in a race. With it, only a regular file is replaced: a device, FIFO, socket or folder that
    took the name is refused (:class:`DestinationError`). The caller removes ``tmp`` if this raises."""
    if overwrite:
        st = _stat_dest(Path(path))
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else _not_regular(st.st_mode)
            raise DestinationError(f"{path} is {kind}, not a regular file: left untouched; give a file name")
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise RecordExistsError(f"{path} appeared while writing; left untouched") from None
    os.unlink(tmp)


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
