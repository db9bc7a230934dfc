"""Bad input, round four: a battery of adversarial inputs over every command that writes or reads a
trace. Outputs over inputs and devices, decompression bombs, huge worlds and bad ranks, destinations
that fill up or turn read-only mid-write, signals mid-write. Every case: the exit code it must give,
one line on stderr (for a refusal) that names the cause, no traceback, no internal error, no input
changed, no temporary file left behind. In-process through ``hwlab.cli.main`` (bounded: every
input is small, every limit that a real bomb would hit is lowered for the test).
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path

import pytest

from hwlab import cli
from hwlab.core import evidence, store
from hwlab.traces import trace_stream

TRACES = evidence.TRACES_DIR
CLEAN = sorted((TRACES / "clean").glob("*.json.gz"))
BASE = evidence.RECORDED_DIR / "h200" / "baseline.json"
DOCTOR = evidence.RECORDED_DIR / "h200" / "doctor.json"


@pytest.fixture
def box(monkeypatch):
    """A short folder (a socket's path must fit 108 bytes) holding every kind of destination."""
    d = Path(tempfile.mkdtemp(prefix="hwb", dir="/tmp"))
    (d / "run.pt.trace.json").write_text(gzip.open(CLEAN[0], "rt").read())
    os.link(d / "run.pt.trace.json", d / "hard.json")
    (d / "sym.json").symlink_to(d / "run.pt.trace.json")
    socks = []
    for suffix in (".json", ".png", ".tar.gz"):  # each writer's own suffix
        (d / f"null{suffix}").symlink_to("/dev/null")
        os.mkfifo(d / f"fifo{suffix}")
        socks.append(socket.socket(socket.AF_UNIX))
        socks[-1].bind(str(d / f"sock{suffix}"))
        (d / f"loop{suffix}").symlink_to(d / f"loop{suffix}")
        (d / f"dir{suffix}").mkdir()
    (d / "file.txt").write_text("a file where a folder is expected\n")
    (d / "existing.json").write_text('{"kept": true}\n')
    (d / "class").mkdir()
    (d / "class" / "result-a-001.json").write_text(json.dumps(_class_result()))
    (d / "drills").mkdir()
    (d / "traces").mkdir()
    for f in CLEAN:
        shutil.copy(f, d / "traces" / f.name)
    monkeypatch.chdir(d)
    monkeypatch.setenv("HWLAB_RESCUE_DIR", str(d / "rescue"))
    monkeypatch.setenv("HWLAB_CACHE", str(d / "cache"))
    yield d
    for sock in socks:
        sock.close()
    shutil.rmtree(d, ignore_errors=True)


def _class_result() -> dict:
    return {"schema": "hwlab.class_result", "schema_version": 1, "kind": "drill", "item": "uncoalesced",
            "learner": "a", "passed": True, "at": "2026-01-01T00:00:00+00:00", "submitted_leaf": "B",
            "right_leaf": "B", "wrong_leaf": None}


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def _state(d: Path) -> dict[str, object]:
    """What the folder holds: every regular file's bytes, every other entry's kind."""
    out: dict[str, object] = {}
    for p in sorted(d.rglob("*")):
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file() and not str(p).startswith(str(d / "rescue")):
            out[str(p)] = p.read_bytes()
        else:
            out[str(p)] = os.stat(p).st_mode if p.exists() else None
    return out


def check(box: Path, argv: list[str], rc_want: int, says: str) -> str:
    before = _state(box)
    dev_null = os.stat("/dev/null")
    rc, out, err = run(argv)
    assert rc == rc_want, (rc, out[-300:], err[-500:])
    assert "Traceback" not in err and "internal error" not in err, err
    if rc_want == 2:
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("reading ")]
        assert len(lines) == 1 and says in lines[0], err
    after = _state(box)
    changed = {k for k in before if k in after and before[k] != after[k]}
    assert not changed, f"changed: {changed}"
    assert not [p for p in box.rglob("*.tmp")], "a temporary file was left behind"
    st = os.stat("/dev/null")
    assert (st.st_mode, st.st_rdev) == (dev_null.st_mode, dev_null.st_rdev)
    return err


# ---------------------------------------------------------------- outputs over inputs and devices
TRACE = "run.pt.trace.json"
#: (destination, what the refusal says); the same for every writer
BAD_DEST = [("run.pt.trace.json", "is the input"), ("hard.json", "is the input"), ("sym.json", "is the input"),
            ("null.json", "character device"), ("fifo.json", "FIFO"), ("sock.json", "socket"),
            ("dir.json", "is a folder"), ("loop.json", "loops back"), ("file.txt/x.json", "under a file"),
            ("/dev/null", "character device"), ("x" * 300 + ".json", "too long")]
NOT_INPUT = [(d, s) for d, s in BAD_DEST if s != "is the input"]


def _examine_out(dest: str, force: bool) -> list[str]:
    return ["examine", "--trace", TRACE, "--out", dest] + (["--force"] if force else [])


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("dest,says", BAD_DEST, ids=[s.replace(" ", "_") + "-" + d[:12] for d, s in BAD_DEST])
def test_examine_out_never_over_an_input_or_a_device(box, dest, says, force):
    check(box, _examine_out(dest, force), 2, says)


def _writers(dest: str, force: bool) -> dict[str, list[str]]:
    f = ["--force"] if force else []
    png = dest.replace(".json", ".png")
    tgz = dest.replace(".json", ".tar.gz")
    return {
        "doctor --save": ["doctor", "--save", dest, *f],
        "baseline record --out": ["baseline", "record", "--out", dest, *f],
        "class summary --plot": ["class", "summary", "class", "--plot", png, *f],
        "bundle": ["bundle", tgz, "--no-doctor", *f],
        "examine --trace --out (folder)": ["examine", "--trace", "traces", "--rank", "0", "--out", dest, *f],
    }


WRITER_CASES = [(w, d, s, force) for d, s in NOT_INPUT if d not in ("/dev/null",)
                for force in (False, True) for w in _writers(d, force)]


@pytest.mark.parametrize("writer,dest,says,force", WRITER_CASES,
                         ids=[f"{w}-{s.replace(' ', '_')}-{'force' if f else 'plain'}" for w, d, s, f in WRITER_CASES])
def test_no_writer_replaces_a_device_fifo_socket_or_folder(box, writer, dest, says, force):
    check(box, _writers(dest, force)[writer], 2, says)


def test_examine_out_may_replace_a_regular_file_with_force(box):
    rc, _, err = run(_examine_out("existing.json", True))
    assert rc in (0, 1, 4), err
    assert json.loads((box / "existing.json").read_text()).get("kept") is None  # replaced: it was asked for


# ---------------------------------------------------------------- bombs
def _gz(path: Path, parts: list[bytes]) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        for p in parts:
            f.write(p)
    return path


@pytest.fixture
def small_limits(monkeypatch):
    """The limits a real bomb meets, scaled down so a test file of a few MB meets them."""
    monkeypatch.setattr(trace_stream, "_RATIO_FLOOR_BYTES", 1 << 20)
    monkeypatch.setattr(trace_stream, "MAX_VALUE_CHARS", 1 << 20)
    monkeypatch.delenv("HWLAB_MAX_TRACE_MIB", raising=False)


BOMBS = {
    "blanks": ([b'{"traceEvents":[', b" " * (8 << 20), b"]}"], "expands more than"),
    "one long name": ([b'{"traceEvents":[{"name":"', b"a" * (4 << 20), b'","ph":"X","ts":1,"dur":1}]}'],
                      "one value longer than"),
    "long top-level value": ([b'{"traceName":"', b"b" * (4 << 20), b'","traceEvents":[]}'], "one value longer than"),
    "5001-digit dur": ([b'{"traceEvents":[{"name":"k","ph":"X","ts":1,"dur":1', b"0" * 5000, b"}]}"],
                       "thousands of digits"),
    "deep nesting": ([b'{"traceEvents":[', b"[" * 100_000, b"]" * 100_000, b"]}"], "nested too deeply"),
}


@pytest.mark.parametrize("packed", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("name", list(BOMBS))
def test_a_bomb_is_refused_in_one_line(box, small_limits, name, packed):
    parts, says = BOMBS[name]
    if packed:
        _gz(box / "bomb.json.gz", parts)
        if name in ("one long name", "long top-level value"):  # compresses past the ratio first
            says = "expands more than"
    else:
        (box / "bomb.json.gz").write_bytes(b"".join(parts))
        if name == "blanks":  # plain blanks are read at C speed to their end: nothing in them
            says = "no host ops"
    check(box, ["examine", "--trace", "bomb.json.gz"], 2, says)


def test_the_size_limit_says_how_to_raise_it_and_the_flag_raises_it(box, small_limits):
    _gz(box / "bomb.json.gz", BOMBS["blanks"][0])
    err = check(box, ["examine", "--trace", "bomb.json.gz"], 2, "--max-trace-mib")
    assert "HWLAB_MAX_TRACE_MIB" in err
    err = check(box, ["examine", "--trace", "bomb.json.gz", "--max-trace-mib", "4"], 2, "expands past 4 MiB")
    # with the limit raised past the file, the ratio check is the user's choice too: read to its end
    check(box, ["examine", "--trace", "bomb.json.gz", "--max-trace-mib", "64"], 2, "no host ops")


@pytest.mark.parametrize("mib", ["0", "-1", "nan", "inf", "abc", "1e300"])
def test_max_trace_mib_must_be_a_size(box, mib):
    check(box, ["examine", "--trace", TRACE, "--max-trace-mib", mib], 2, "--max-trace-mib")


def test_progress_counts_decompressed_bytes(box, small_limits, monkeypatch):
    monkeypatch.setattr(trace_stream, "PROGRESS_EVERY_BYTES", 1 << 18)
    monkeypatch.setattr(trace_stream, "CHUNK_CHARS", 1 << 16)
    _gz(box / "bomb.json.gz", BOMBS["blanks"][0])
    seen = []
    with pytest.raises(trace_stream.TraceError):
        for _ in trace_stream.iter_trace(box / "bomb.json.gz", lambda done, total: seen.append((done, total))):
            pass
    assert len(seen) >= 2 and all(t == 0 for _, t in seen)  # a gzip's expanded size is not known ahead
    assert seen[-1][0] > 10 * (box / "bomb.json.gz").stat().st_size  # past the compressed size: decompressed


BAD_TIMES = {"negative": -5, "text": '"5"', "true": "true", "null": "null", "1e308": "1e308", "huge ts": None}


@pytest.mark.parametrize("kind", list(BAD_TIMES))
def test_events_whose_times_cannot_place_them_are_counted_and_named(box, kind):
    v = BAD_TIMES[kind]
    ev = ('{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1e30,"dur":5,"pid":1,"tid":1}' if v is None else
          '{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":%s,"pid":1,"tid":1}' % v)
    (box / "bad.json").write_text('{"traceEvents":[' + ",".join([ev] * 3) + "]}")
    check(box, ["examine", "--trace", "bad.json"], 2, "3 complete event(s) left out")


# ---------------------------------------------------------------- huge worlds, bad ranks
def _ranks_folder(box: Path, rank_of, world_of) -> Path:
    d = box / "job"
    d.mkdir()
    for i, f in enumerate(CLEAN):
        t = json.load(gzip.open(f))
        t["distributedInfo"]["rank"] = rank_of(i)
        t["distributedInfo"]["world_size"] = world_of(i)
        (d / f"rank{i}.pt.trace.json").write_text(json.dumps(t))
    return d


BAD_WORLDS = {"1e9": 10**9, "text": "4", "fraction": 1.5, "zero": 0, "negative": -4, "true": True, "1e30": 10**30}


@pytest.mark.parametrize("name", list(BAD_WORLDS))
def test_a_world_size_no_job_has_is_named_not_ranged_over(box, name):
    _ranks_folder(box, lambda i: i, lambda i: BAD_WORLDS[name])
    check(box, ["ranks", "--traces", "job"], 2, "distributedInfo.world_size")


BAD_RANKS = {"text": "1", "fraction": 1.5, "negative": -1, "out of world": 4, "huge": 10**30, "true": True}


@pytest.mark.parametrize("name", list(BAD_RANKS))
def test_one_bad_rank_is_named_and_skipped_the_rest_read(box, name):
    _ranks_folder(box, lambda i: BAD_RANKS[name] if i == 1 else i, lambda i: 4)
    rc, out, err = run(["ranks", "--traces", "job"])
    assert rc == 4, err  # undecided: rank 1 is unread and may be the slow one
    assert "rank1.pt.trace.json" in err and "distributedInfo.rank" in err
    assert "Traceback" not in err and "internal error" not in err


def test_a_stated_world_far_past_the_traces_present_is_refused(box, monkeypatch):
    from hwlab.traces import rank_reading

    monkeypatch.setattr(rank_reading, "MAX_MISSING_RANKS", 10)
    _ranks_folder(box, lambda i: i, lambda i: 100)
    check(box, ["ranks", "--traces", "job"], 2, "world of 100 ranks but the folder holds 4")


def test_one_bomb_in_a_ranks_folder_is_named_and_skipped(box, small_limits):
    _gz(box / "traces" / "rank9.pt.trace.json.gz", BOMBS["blanks"][0])
    rc, out, err = run(["ranks", "--traces", "traces"])
    assert rc == 4 and "rank9.pt.trace.json.gz" in err and "expands more than" in err, err


@pytest.mark.parametrize("g", ["1e-320", "0", "-1", "nan", "inf", "1e30", "fast"])
def test_link_gbps_must_be_a_link(box, g):
    check(box, ["ranks", "--traces", "traces", "--link-gbps", g], 2, "--link-gbps")


# ---------------------------------------------------------------- destinations that fail mid-write
FAILS = {"full": errno.ENOSPC, "too large": errno.EFBIG, "read-only": errno.EROFS, "quota": errno.EDQUOT}


@pytest.fixture
def failing_fsync(monkeypatch):
    real = os.fsync

    def set_errno(code):
        def fail(fd):  # the destination fails; the rescue folder still takes files
            if "/rescue/" not in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(code, os.strerror(code))
            real(fd)
        monkeypatch.setattr(store.os, "fsync", fail)
    return set_errno


@pytest.mark.parametrize("fail", list(FAILS))
def test_a_record_whose_write_fails_goes_to_the_rescue_folder(box, failing_fsync, fail):
    failing_fsync(FAILS[fail])
    rc, out, err = run(["drill", "new", "--seed", "7", "--dir", "drills"])
    assert rc == 2 and "saved to" in err and os.strerror(FAILS[fail]) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list((box / "rescue").glob("drill-*.json")) and not list(box.rglob("*.tmp"))


@pytest.mark.parametrize("fail", list(FAILS))
def test_an_examination_whose_write_fails_is_printed_and_rescued(box, failing_fsync, fail):
    failing_fsync(FAILS[fail])
    rc, out, err = run(["examine", "--trace", TRACE, "--out", "ex.json", "--json"])
    assert rc == 2 and "saved to" in err and json.loads(out)["trace"], err
    assert not (box / "ex.json").exists() and not list(box.rglob("*.tmp"))


@pytest.mark.parametrize("fail", list(FAILS))
def test_an_incident_whose_write_fails_says_what_to_do(box, failing_fsync, fail):
    failing_fsync(FAILS[fail])
    rc, out, err = run(["incident", "--title", "t", "--scope", "single-card", "--symptom", "s", "--fix", "f",
                        "--reverify", "r", "--evidence", str(BASE), "--out", "inc"])
    assert rc == 2 and "Traceback" not in err and "internal error" not in err, err
    assert os.strerror(FAILS[fail]) in err and len(err.strip().splitlines()) == 1
    assert not list(box.rglob("*.tmp"))


@pytest.mark.parametrize("fail", list(FAILS))
def test_a_bundle_whose_write_fails_leaves_nothing_half_written(box, monkeypatch, fail):
    import tarfile

    real = tarfile.TarFile.addfile

    def addfile(self, *a, **k):
        raise OSError(FAILS[fail], os.strerror(FAILS[fail]))
    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    rc, out, err = run(["bundle", "b.tar.gz", "--no-doctor"])
    monkeypatch.setattr(tarfile.TarFile, "addfile", real)
    assert rc == 2 and os.strerror(FAILS[fail]) in err and "internal error" not in err, err
    assert not (box / "b.tar.gz").exists() and not list(box.glob(".b.tar.gz.*"))


# ---------------------------------------------------------------- signals mid-write
@pytest.fixture
def term_during_fsync(monkeypatch):
    real = os.fsync

    def fsync(fd):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (the main) thread before fsync returns
        real(fd)
    monkeypatch.setattr(store.os, "fsync", fsync)


@pytest.mark.parametrize("existing", [False, True], ids=["new", "over an existing file"])
def test_sigterm_mid_write_removes_the_temp_file_and_says_what_was_kept(box, term_during_fsync, existing):
    target = box / ("existing.json" if existing else "new.json")
    before = target.read_bytes() if existing else None
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        store.write_text_atomic(target, '{"new": 1}\n', overwrite=True)
    assert e.value.code == 128 + signal.SIGTERM
    assert not list(box.glob(".*.tmp"))
    assert (target.read_bytes() == before) if existing else not target.exists()
    assert "SIGTERM" in err.getvalue() and ("left as it was" if existing else "was not written") in err.getvalue()
    assert signal.getsignal(signal.SIGTERM) is not None  # the handler before the write is back


def test_sigterm_mid_write_through_the_cli_ends_the_command(box, term_during_fsync):
    rc, out, err = run(["drill", "new", "--seed", "3", "--dir", "drills"])
    assert rc == 128 + signal.SIGTERM and "SIGTERM" in err and "was not written" in err
    assert not list((box / "drills").iterdir())


def test_sigterm_while_writing_an_annotated_trace(box, monkeypatch):
    import gzip as gz_mod

    real_close = gz_mod.GzipFile.close

    def close(self):
        if self.mode == gz_mod.WRITE and not getattr(self, "_hit", False):
            self._hit = True
            os.kill(os.getpid(), signal.SIGTERM)
        return real_close(self)
    monkeypatch.setattr(gz_mod.GzipFile, "close", close)
    rc, out, err = run(["examine", "--trace", TRACE, "--out", "ex.json"])
    assert rc == 128 + signal.SIGTERM and "SIGTERM" in err
    assert not list(box.glob(".*.tmp")) and not (box / "ex.annotated.trace.json.gz").exists()


# ---------------------------------------------------------------- unclear lines made clear
MISC = [
    (["examine", "--trace", ""], "--trace is empty"),
    (["evidence", "show", ""], "evidence show ''"),
    (["examine", "--trace", "loop.json"], "loops back on itself"),
    (["examine", "--trace", "loop.tar.gz"], "loops back on itself"),
    (["ranks", "--traces", "loop.json"], "Too many levels of symbolic links"),
    (["class", "summary", "loop.json"], "Too many levels of symbolic links"),
    (["ranks", "--traces", "file.txt"], "is not a folder"),
    (["examine", "--n-bytes", "1" + "0" * 400, "x.py:f"], "past any counter"),
    (["examine", "--n-flops", "9" * 30, "x.py:f"], "past any counter"),
    (["drill", "summary", "--dir", "drills"], "no grades"),
    (["drill", "submit", "d.json", "--fault", "nosuch", "--leaf", "B"], "--fault goes with `drill new`"),
    (["drill", "reveal", "d.json", "--fault", "tail"], "--fault goes with `drill new`"),
    (["lab", "--ip", "999.1.1.1", "--no-browser"], "--ip 999.1.1.1"),
]


@pytest.mark.parametrize("argv,says", MISC, ids=[" ".join(a)[:40] for a, _ in MISC])
def test_unclear_lines_name_the_cause(box, argv, says):
    check(box, argv, 2, says)


def test_evidence_list_of_an_empty_recorded_folder_is_refused(box, monkeypatch):
    monkeypatch.setattr(evidence, "RECORDED_DIR", box / "nothing")
    check(box, ["evidence", "list"], 2, "no recorded evidence")


def test_a_raw_errno_is_said_in_words_with_what_to_do(box, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "drills/x.json")
    monkeypatch.setattr(store, "check_folder", refuse)
    from hwlab.cli import cmd_drill
    monkeypatch.setattr(cmd_drill, "check_folder", refuse)
    err = check(box, ["drill", "new", "--dir", "drills"], 2, "check its permissions")
    assert "[Errno" not in err


def test_baselines_written_in_the_same_second_keep_both(box, monkeypatch):
    from hwlab.diagnosis import baseline

    first = baseline.default_path(box)
    first.write_text("{}")
    assert baseline.default_path(box, 1) != first and baseline.default_path(box, 1).name.endswith("-1.json")


# ---------------------------------------------------------------- the Python API
@pytest.mark.parametrize("case", ["meta tensor", "ceilings as text", "ceilings as a dict"])
def test_the_api_refuses_what_it_cannot_time_in_one_line(case):
    import torch

    from hwlab.errors import UserInputError
    from hwlab.examine import examine

    x = torch.ones(8, device="meta") if case == "meta tensor" else torch.ones(8)
    kw = {"ceilings": "fast"} if case == "ceilings as text" else {"ceilings": {"copy_gbps": 1}} \
        if case == "ceilings as a dict" else {}
    with pytest.raises(UserInputError, match="meta tensor|ceilings="):
        examine(lambda t: t * 2, x, **kw)


def test_a_killed_writes_temp_file_is_removed_by_the_next_write(box):
    """SIGKILL runs no handler: the next write of the same target removes the temp file it left
    once it is older than any write takes; a fresh one (a write under way) is left alone."""
    import time

    old = box / ".new.json.abcd1234.tmp"
    fresh = box / ".new.json.efgh5678.tmp"
    for p in (old, fresh):
        p.write_text('{"half": ')
    os.utime(old, (time.time() - 2 * store.STALE_TEMP_S,) * 2)
    store.write_text_atomic(box / "new.json", "{}\n")
    assert not old.exists() and fresh.exists()


def test_class_init_never_turns_a_shared_folder_into_a_drop_box(box):
    import grp

    shared = box / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "someone_elses.txt").write_text("x")
    group = grp.getgrgid(os.getegid()).gr_name
    check(box, ["class", "init", str(shared), "--group", group], 2, "writable by everyone")
    assert stat_mode(shared) == 0o1777 and not (shared / "inbound").exists()


def stat_mode(p: Path) -> int:
    import stat

    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EACCES, errno.EROFS, errno.EPERM],
                         ids=["ENOENT", "EACCES", "EROFS", "EPERM"])
@pytest.mark.parametrize("argv", [["doctor", "--save", "d.json"], ["baseline", "record", "--out", "b.json"],
                                  ["drill", "new", "--dir", "drills"], ["bundle", "b.tar.gz", "--no-doctor"],
                                  ["examine", "--trace", TRACE, "--out", "e.json"]],
                         ids=["doctor", "baseline", "drill", "bundle", "examine"])
def test_an_unwritable_destination_is_refused_before_work_whatever_the_errno(box, monkeypatch, argv, code):
    """A file system says "cannot write here" with different errnos (a /proc folder gives ENOENT, a
    read-only mount EROFS, permissions EACCES or EPERM): each is one line naming the folder, exit 2."""
    def refuse(*a, **k):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(store.tempfile, "mkstemp", refuse)
    check(box, argv, 2, "cannot write into")

