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
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

from hwlab.errors import UserInputError

CHUNK_CHARS = 1 << 20  # characters decoded per read: the bound on the reader's buffer
PROGRESS_EVERY_BYTES = 64 << 20  # a progress call per 64 MB of file read
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


class _Stream:
    """Characters from a (gzipped) file in chunks, with the byte position of the file read."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None):
        self.raw = open(path, "rb")
        self.total = os.fstat(self.raw.fileno()).st_size
        gz = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        inner = gzip.GzipFile(fileobj=self.raw) if gz else self.raw
        self.text = io.TextIOWrapper(inner, encoding="utf-8", errors="replace")
        self.progress, self.next_report = progress, PROGRESS_EVERY_BYTES
        self.buf, self.pos, self.eof, self.consumed = "", 0, False, 0

    def close(self) -> None:
        self.text.close()
        self.raw.close()

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = self.text.read(CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        if self.progress and self.raw.tell() >= self.next_report:
            self.progress(self.raw.tell(), self.total)
            self.next_report = self.raw.tell() + PROGRESS_EVERY_BYTES
        return True

    def skip_ws(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
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
            except RecursionError:  # nesting deeper than the decoder's stack: no trace event is that deep
                raise self.error("a value nested too deeply to be a trace event") from None
            if not self.more():
                if self.pos >= len(self.buf):
                    raise self.error("truncated (file ends inside a value)")

    def error(self, what: str) -> TraceError:
        return TraceError(f"{self.raw.name}: {what} near character {self.consumed + self.pos}: "
                          "pass a complete trace written by torch.profiler (export_chrome_trace or "
                          "tensorboard_trace_handler)")


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
                        while True:
                            yield "event", s.value()
                            if s.expect(",]") == "]":
                                break
                if s.expect(",}") == "}":
                    break
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as e:
            raise s.error(f"cannot be decoded ({type(e).__name__}: {e})") from None
    finally:
        s.close()
