"""The trace file format, streaming: a Chrome / Kineto JSON trace decoded one top-level entry and
one event at a time (:func:`iter_trace`), and which files in a folder are traces (:func:`sniff`,
:func:`discover_traces`). Standard library only, no torch.

* **Streaming.** The top-level object is decoded key by key and the ``traceEvents`` array one
  event at a time with :meth:`json.JSONDecoder.raw_decode` over chunks of :data:`CHUNK_CHARS`
  characters: memory grows with what a reader keeps, not with the file.
* **Bad files.** A path that is not a regular file is refused before it is opened; a truncated or
  malformed file, or a value nested deeper than the decoder's stack (no trace event is), raises
  :class:`TraceError` with the character offset where it broke.
* **Which files are traces** is decided by content: the start of the file must be a JSON object
  that names ``traceEvents``, ``schemaVersion`` or ``deviceProperties``; the kit's own records
  (``"schema": "hwlab.*"``) and everything else are listed with the reason they were skipped.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from hwlab.errors import UserInputError

CHUNK_CHARS = 1 << 20  # characters decoded per read: the bound on the reader's buffer
PROGRESS_EVERY_BYTES = 64 << 20  # a progress call per 64 MB of JSON text decoded
PEEK_CHARS = 1 << 16  # characters read from the start of a file to tell a profiler trace from anything else
TRACE_MARKERS = ('"traceEvents"', '"schemaVersion"', '"deviceProperties"')
TRACE_SUFFIXES = (".json", ".json.gz")


class TraceError(UserInputError):
    """A trace file that cannot be read as a Chrome/Kineto trace (one line, with where it broke)."""


def sniff(path: str | os.PathLike) -> str | None:
    """None when the file's start is a profiler trace (module docstring), else why it is not one."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO or device?)"
    if st.st_size == 0:
        return "empty file (0 bytes)"
    try:
        with open(p, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            inner = gzip.GzipFile(fileobj=raw) if gz else raw
            head = inner.read(PEEK_CHARS).decode("utf-8", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        return f"cannot be decompressed ({type(e).__name__}: {e})"
    text = head.lstrip()
    if not text:
        return "empty (nothing but white space)"
    if re.search(r'"schema"\s*:\s*"hwlab\.', text[:4096]):
        m = re.search(r'"schema"\s*:\s*"(hwlab\.[a-z_]+)', text)
        return f"the kit's own record ({m.group(1) if m else 'hwlab'}), not a profiler trace"
    if text[0] != "{":
        return ("a JSON array, not a profiler trace object" if text[0] == "[" else
                "not a JSON object at its start")
    if not any(k in head for k in TRACE_MARKERS):
        if '"nodes"' in head and '"schema"' in head:
            return "a PyTorch execution trace (nodes), not a profiler trace"
        return f"no {', '.join(TRACE_MARKERS)} in its first {PEEK_CHARS // 1024} KiB: not a profiler trace"
    return None


def discover_traces(folder: str | os.PathLike, *, depth: int = 1) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(traces, skipped with the reason) of every file in ``folder`` and ``depth`` levels of
    sub-folders (jobs write per-host ones). A ``.json`` / ``.json.gz`` file is a trace when its
    content starts like one (:func:`sniff`), whatever its name; every other file is listed as
    skipped with why."""
    d = Path(folder)
    files: list[Path] = []
    for level in range(depth + 1):
        files += sorted(p for p in d.glob("/".join(["*"] * (level + 1))) if not p.is_dir())
    traces: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for p in files:
        if not p.name.endswith(TRACE_SUFFIXES):
            skipped.append((p, "not .json / .json.gz"))
            continue
        why = sniff(p)
        if why is None:
            traces.append(p)
        else:
            skipped.append((p, why))
    return traces, skipped


#: the most JSON text one trace may expand to, bytes (a gzip of blanks or of one giant value
#: expands a thousandfold: a 2 MB file to 2 GiB); raised for one command with ``--max-trace-mib``
#: or ``HWLAB_MAX_TRACE_MIB`` (:func:`text_limit`)
MAX_TEXT_BYTES = 2 << 30
#: the largest single value (an event, a top-level entry), characters: the events torch.profiler
#: writes are a few hundred bytes, its largest top-level entries kilobytes; a value of 64 MiB is
#: not a trace event, and decoding it only to drop it would hold the reader for minutes
MAX_VALUE_CHARS = 64 << 20
#: the most a gzipped trace may expand, times its compressed size, unless a limit is given for
#: the command: profiler traces compress 10 to 30 times (JSON of repeated names and keys); 200
#: times is blanks or one repeated value, a decompression bomb (checked past 64 MiB of JSON)
MAX_GZIP_RATIO = 200
_RATIO_FLOOR_BYTES = 64 << 20
_NON_WS = re.compile(r"[^ \t\r\n]")
_limit: list[tuple[int, bool]] = []  # (bytes, given by the user) per open text_limit block


@contextmanager
def text_limit(max_mib: float | None) -> Iterator[None]:
    """Within the block, traces may expand to ``max_mib`` MiB of JSON (None: the default,
    :data:`MAX_TEXT_BYTES` or ``HWLAB_MAX_TRACE_MIB``)."""
    if max_mib is not None and not (math.isfinite(max_mib) and max_mib > 0):
        raise UserInputError(f"--max-trace-mib {max_mib}: give a size in MiB above 0")
    given = max_mib is not None or _user_limit() is not None
    _limit.append((int(max_mib * 2**20) if max_mib is not None else max_text_bytes(), given))
    try:
        yield
    finally:
        _limit.pop()


def max_text_bytes() -> int:
    """The expanded size a trace may have now (:func:`text_limit`, else the environment, else
    :data:`MAX_TEXT_BYTES`)."""
    if _limit:
        return _limit[-1][0]
    return _user_limit() or MAX_TEXT_BYTES


def _user_limit() -> int | None:
    """``HWLAB_MAX_TRACE_MIB`` in bytes, None when unset."""
    env = os.environ.get("HWLAB_MAX_TRACE_MIB", "").strip()
    if not env:
        return None
    try:
        v = float(env)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise UserInputError(f"HWLAB_MAX_TRACE_MIB={env!r} is not a size in MiB above 0: unset it or give one")
    return int(v * 2**20)


def _limit_given() -> bool:
    """Whether the user set the limit (then the gzip ratio check is theirs to lift too)."""
    return _limit[-1][1] if _limit else _user_limit() is not None


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:,.1f} MB" if n_bytes >= 100_000 else f"{n_bytes:,} byte"


def describe_progress(done: int, total: int) -> str:
    """A progress call's figures in words: the JSON text read so far, and of how much where known
    (a gzipped file's expanded size is known only at its end)."""
    if total > 0:
        return f"{done / 1e6:,.0f} of {total / 1e6:,.0f} MB"
    return f"{done / 1e6:,.0f} MB of JSON decompressed so far"


class _Stream:
    """Characters from a (gzipped) file in chunks, with the count of characters read. Progress
    is reported by characters of JSON decoded (a gzip bomb shows it grow), the expanded size is
    bounded by :func:`max_text_bytes` and one value by :data:`MAX_VALUE_CHARS`."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None):
        self.raw = open(path, "rb")
        self.total = os.fstat(self.raw.fileno()).st_size
        self.gz = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        inner = gzip.GzipFile(fileobj=self.raw) if self.gz else self.raw
        self.text = io.TextIOWrapper(inner, encoding="utf-8", errors="replace")
        self.progress, self.next_report = progress, PROGRESS_EVERY_BYTES
        self.buf, self.pos, self.eof, self.consumed, self.read_chars = "", 0, False, 0, 0
        self.max_chars = max_text_bytes()
        self.max_ratio_chars = (max(_RATIO_FLOOR_BYTES, MAX_GZIP_RATIO * self.total)
                                if self.gz and not _limit_given() else None)

    def close(self) -> None:
        self.text.close()
        self.raw.close()

    def more(self, n_chars: int | None = None) -> bool:
        if self.eof:
            return False
        chunk = self.text.read(n_chars or CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        self.read_chars += len(chunk)
        if self.read_chars > self.max_chars:
            how = (f"a {_size(self.total)} gzip that expands past" if self.gz else "more than")
            raise TraceError(f"{self.raw.name} is {how} {self.max_chars / 2**20:,.0f} MiB of JSON, the most "
                             "hwlab reads from one trace (a trace this large is slow to read, and a "
                             "small gzip that expands this far is usually not a trace): pass "
                             "--max-trace-mib MIB (or set HWLAB_MAX_TRACE_MIB) to read it anyway")
        if self.max_ratio_chars is not None and self.read_chars > self.max_ratio_chars:
            raise TraceError(f"{self.raw.name} is a {_size(self.total)} gzip that expands more than "
                             f"{MAX_GZIP_RATIO} times (past {self.read_chars / 2**20:,.0f} MiB of JSON so far); "
                             "profiler traces compress 10 to 30 times, so this is likely not a trace: pass "
                             "--max-trace-mib MIB (or set HWLAB_MAX_TRACE_MIB) to read it anyway")
        self.consumed += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        if self.progress and self.read_chars >= self.next_report:
            self.progress(self.read_chars, 0 if self.gz else self.total)
            self.next_report = self.read_chars + PROGRESS_EVERY_BYTES
        return True

    def skip_ws(self) -> str:
        while True:
            m = _NON_WS.search(self.buf, self.pos)  # in C: a file of blanks is read at decompression speed
            if m is not None:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            if not self.more():
                return ""

    def expect(self, chars: str) -> str:
        c = self.skip_ws()
        if c == "" or c not in chars:
            raise self.error(f"expected one of {chars!r}, found {c or 'end of file'!r}")
        self.pos += 1
        return c

    def value(self, dec: json.JSONDecoder = json.JSONDecoder()) -> Any:
        self.skip_ws()
        while True:
            try:
                v, end = dec.raw_decode(self.buf, self.pos)
                # a number or literal at the end of the buffer may continue in the next chunk
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return v
            except json.JSONDecodeError:
                if self.eof:
                    raise self.error("malformed or truncated JSON")
            except ValueError:  # an integer past Python's digit limit (4,300): no trace time is one
                raise self.error("a number with thousands of digits (no trace time or count has them)") from None
            except RecursionError:  # nesting deeper than the decoder's stack: no trace event is that deep
                raise self.error("a value nested too deeply to be a trace event") from None
            held = len(self.buf) - self.pos
            if held > MAX_VALUE_CHARS:
                raise self.error(f"one value longer than {MAX_VALUE_CHARS / 2**20:,.0f} MiB (no trace event "
                                 "is; a name or argument this long is not one torch.profiler writes)")
            # read as much again as the value holds so far: a long value is decoded a bounded
            # number of times (linear in its size), not once per chunk
            if not self.more(max(CHUNK_CHARS, held)):
                if self.pos >= len(self.buf):
                    raise self.error("truncated (file ends inside a value)")

    def error(self, what: str) -> TraceError:
        return TraceError(f"{self.raw.name}: {what} near character {self.consumed + self.pos}: "
                          "pass a complete trace written by torch.profiler (export_chrome_trace or "
                          "tensorboard_trace_handler)")


#: the longest an event may last, microseconds: a day. A profiled step is milliseconds to
#: seconds and a trace covers minutes at most; a duration of 1e308 us is a corrupt field, and
#: taken at its word it would make one step last longer than the universe
MAX_EVENT_US = 86_400e6
#: the largest timestamp, microseconds: about 3,000 years after 1970 (kineto writes microseconds
#: since the epoch, or since the trace's start)
MAX_TS_US = 1e17


def event_times(ev: dict[str, Any]) -> tuple[float, float] | None:
    """(ts, dur) of a complete event in microseconds, or None when its times cannot place it:
    missing, text, true/false, NaN, infinite, a negative duration, one over :data:`MAX_EVENT_US`
    or a timestamp past :data:`MAX_TS_US`. Both readers count what this refuses and say so."""
    ts, dur = ev.get("ts"), ev.get("dur", 0.0)
    for v in (ts, dur):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
    try:
        t, d = float(ts), float(dur)
    except OverflowError:
        return None
    if not (math.isfinite(t) and math.isfinite(d)) or not 0 <= d <= MAX_EVENT_US or abs(t) > MAX_TS_US:
        return None
    return t, d


_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _items(s: _Stream) -> Iterator[Any]:
    """The values of an array whose ``[`` was read, up to its ``]`` (consumed). Events are
    decoded straight from the buffer while it holds them whole (millions of events: the cost
    is the decoding, not a method call per separator); at a buffer's end, or anything unusual,
    one step goes through :meth:`_Stream.value` / :meth:`_Stream.expect`, which read more and
    name what is wrong."""
    dec = _DECODER.raw_decode
    want_value = True
    while True:
        buf, pos, n = s.buf, s.pos, len(s.buf)
        while True:
            if pos < n and buf[pos] in _WS:
                m = _NON_WS.search(buf, pos)
                pos = m.start() if m is not None else n
            if pos >= n:
                break
            if want_value:
                try:
                    v, end = dec(buf, pos)
                except (ValueError, RecursionError):  # malformed, or huge: the careful path names it
                    break
                if end >= n:  # a number at the buffer's end may go on in the next chunk
                    break
                s.pos = end
                yield v
                pos, want_value = end, False
            elif buf[pos] == ",":
                pos, want_value = pos + 1, True
            elif buf[pos] == "]":
                s.pos = pos + 1
                return
            else:
                break
        s.pos = pos
        if want_value:
            yield s.value()
            want_value = False
        elif s.expect(",]") == "]":
            return
        else:
            want_value = True


def iter_trace(path: str | os.PathLike, progress: Callable[[int, int], None] | None = None
               ) -> Iterator[tuple[str, Any]]:
    """(key, value) of each top-level entry but ``traceEvents``, and ("event", ev) per event, in
    file order, streaming (the file is never loaded whole). The one reader of the format: every
    trace reader of the kit (:func:`read_trace`, :mod:`hwlab.traces.trace_ops`,
    :mod:`hwlab.traces.trace_events`) walks it. A path that is not a regular file is refused before
    it is opened; a truncated or malformed file raises :class:`TraceError` with the byte offset."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise UserInputError(f"{p}: cannot read ({e.strerror}): pass a trace file") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"{p} is not a regular file (a FIFO or device?): pass a saved trace file")
    s = _Stream(p, progress)
    try:
        try:
            s.expect("{")
            if s.skip_ws() == "}":
                raise s.error("empty object, no traceEvents")
            while True:
                key = s.value()
                s.expect(":")
                if key != "traceEvents":
                    yield key, s.value()
                else:
                    s.expect("[")
                    if s.skip_ws() == "]":
                        s.pos += 1
                    else:
                        for ev in _items(s):
                            yield "event", ev
                if s.expect(",}") == "}":
                    break
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as e:
            raise s.error(f"cannot be decoded ({type(e).__name__}: {e})") from None
    finally:
        s.close()
