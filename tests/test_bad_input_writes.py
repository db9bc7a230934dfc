"""Bad input, round four (continued from test_bad_input_battery): destinations that fail at the write
itself, after the check before any work passed (the disk fills, a size limit, a mount turned
read-only, a quota): for ``bundle``, ``drill new``, ``lab``'s working copy and ``class init``. Each:
one line (exit 2) naming the cause and what was kept, the result in the rescue folder where there is
one, no temporary file left, no internal error. Injected at the file's write in-process, then for
real: a full tmpfs (root only) and a file-size limit (``ulimit -f``) in a subprocess.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

from test_bad_input_battery import FAILS, box, run  # noqa: F401 - box is a fixture

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


class _FailingFile:
    """A file opened for writing whose every ``write`` fails with ``code`` (the disk filled, a size
    limit, the mount turned read-only after the destination was checked)."""

    def __init__(self, f, code: int):
        self._f, self._code = f, code

    def write(self, data):
        raise OSError(self._code, os.strerror(self._code))

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture
def failing_write(monkeypatch, box):
    """``failing_write(code)``: every file opened for writing by path in the box (not in the rescue
    folder) fails at its first write; what gzip, tarfile, the records and the working copy open."""
    import builtins

    real = builtins.open

    def set_errno(code):
        def fake_open(file, mode="r", *a, **k):
            f = real(file, mode, *a, **k)
            path = str(file) if isinstance(file, (str, os.PathLike)) else ""
            if any(c in mode for c in "wax+") and path and str(box / "rescue") not in os.path.abspath(path):
                return _FailingFile(f, code)
            return f
        monkeypatch.setattr(builtins, "open", fake_open)
    return set_errno


def _no_temp_left(box: Path) -> None:
    assert not [p for p in box.rglob("*") if p.name.endswith(".tmp")], "a temporary file was left behind"


@pytest.mark.parametrize("fail", list(FAILS))
def test_a_bundle_whose_write_fails_at_the_write_goes_to_the_rescue_folder(box, failing_write, fail):
    failing_write(FAILS[fail])
    rc, out, err = run(["bundle", "b.tar.gz", "--no-doctor"])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert os.strerror(FAILS[fail]) in err and "saved to" in err and "internal error" not in err, err
    kept = list((box / "rescue").glob("bundle-*.tar.gz"))
    assert len(kept) == 1 and str(kept[0]) in err and "wrote" not in out
    import tarfile

    with tarfile.open(kept[0]) as tar:  # the whole archive, under the name asked for
        assert "b/MANIFEST.json" in tar.getnames()
    assert not (box / "b.tar.gz").exists()
    _no_temp_left(box)


@pytest.mark.parametrize("fail", list(FAILS))
def test_a_drill_whose_write_fails_at_the_write_goes_to_the_rescue_folder(box, failing_write, fail):
    failing_write(FAILS[fail])
    rc, out, err = run(["drill", "new", "--seed", "11", "--dir", "drills"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "saved to" in err, err
    kept = list((box / "rescue").glob("drill-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["seed"] == 11
    assert not list((box / "drills").iterdir())
    _no_temp_left(box)


def test_when_the_rescue_folder_fails_too_the_line_says_nothing_was_kept(box, monkeypatch):
    """A drill is never printed (it holds the hidden fault), an archive is a file: neither line may
    say "the result printed is the only copy"."""
    import builtins

    real = builtins.open

    def fake_open(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        return _FailingFile(f, errno.ENOSPC) if any(c in mode for c in "wax+") and isinstance(file, (str, Path)) else f
    monkeypatch.setattr(builtins, "open", fake_open)
    for argv, says in ((["drill", "new", "--dir", "drills"], "no drill was kept"),
                       (["bundle", "b.tar.gz", "--no-doctor"], "nothing was written")):
        rc, out, err = run(argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err, err
        assert "printed is the only copy" not in err
    assert not [p for p in (box / "rescue").rglob("*") if p.is_file()]  # no empty or partial file kept
    _no_temp_left(box)


@pytest.fixture
def lab_home(box, monkeypatch):
    """``hwlab lab`` in-process with its home in the box; serving is replaced by a failure, so a test
    in which the copy succeeds cannot start a server."""
    from hwlab.cli import lablaunch

    def no_serve(*a, **k):
        raise AssertionError("the working copy was expected to fail before serving")
    monkeypatch.setattr(lablaunch, "serve", no_serve)
    monkeypatch.setenv("HWLAB_HOME", str(box / "home"))
    return box / "home"


LAB = ["lab", "--no-browser", "--dir", str(NOTEBOOKS), "--port", "18931"]


@pytest.mark.parametrize("fail", list(FAILS))
def test_a_working_copy_whose_write_fails_says_what_was_kept_and_completes_later(box, lab_home, monkeypatch,
                                                                                 fail):
    """The copy fails at its 4th file: one line (the cause, what was kept, run again), the 3 files
    already copied are whole, no temporary file is left, and the next start completes the copy and
    records all of them (a later --refresh keeps them up to date)."""
    import builtins

    from hwlab.cli import workcopy

    real, n = builtins.open, [0]

    def fake_open(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        if "w" in mode and str(lab_home) in str(file) and str(file).endswith(".tmp"):
            n[0] += 1
            if n[0] >= 4:
                return _FailingFile(f, FAILS[fail])
        return f
    monkeypatch.setattr(builtins, "open", fake_open)
    rc, out, err = run(LAB)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert os.strerror(FAILS[fail]) in err and "HWLAB_HOME" in err and "when run again" in err, err
    _no_temp_left(box)
    root = workcopy.copy_root(NOTEBOOKS.parent)
    copied = [p for p in root.rglob("*") if p.is_file() and ".hwlab" not in p.parts]
    assert copied and not (root / workcopy.MANIFEST).exists()
    kernel = workcopy.kit_kernel()
    for p in copied:  # whole: the bytes the copy gets
        rel = p.relative_to(root).as_posix()
        assert p.read_bytes() == workcopy.learner_version(NOTEBOOKS.parent / rel, kernel), rel
    monkeypatch.setattr(builtins, "open", real)
    rep = workcopy.prepare(NOTEBOOKS.parent, root=root, kernel=kernel)
    man = json.loads((root / workcopy.MANIFEST).read_text())
    assert set(man["files"]) == set(workcopy.kit_files(NOTEBOOKS.parent))
    assert {p.relative_to(root).as_posix() for p in copied if "/" in p.relative_to(root).as_posix()} <= \
        set(rep.adopted)


def test_sigterm_while_the_working_copy_writes_removes_the_temp_file(box, monkeypatch):
    import builtins

    from hwlab.cli import workcopy

    real = builtins.open

    class _Term(_FailingFile):
        def write(self, data):
            os.kill(os.getpid(), signal.SIGTERM)
            return self._f.write(data)

    def fake_open(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        return _Term(f, 0) if "w" in mode and str(file).endswith(".tmp") else f
    monkeypatch.setattr(builtins, "open", fake_open)
    target = box / "copy" / "notebooks" / "00.ipynb"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        workcopy._write_new(target, b"{}\n")
    assert e.value.code == 128 + signal.SIGTERM and "SIGTERM" in err.getvalue() and "was not written" in err.getvalue()
    assert not target.exists() and not list(target.parent.iterdir())


@pytest.mark.parametrize("fail", list(FAILS))
@pytest.mark.parametrize("step", ["inbound folder", "mode"])
def test_class_init_that_fails_midway_is_one_line_and_a_rerun_completes_it(box, monkeypatch, fail, step):
    import grp

    from hwlab.course import dropbox

    group = grp.getgrgid(os.getegid()).gr_name
    real_mkdir, real_chmod = os.mkdir, os.chmod

    def mkdir(p, *a, **k):
        if step == "inbound folder" and str(p).endswith("inbound"):
            raise OSError(FAILS[fail], os.strerror(FAILS[fail]), str(p))
        return real_mkdir(p, *a, **k)

    def chmod(p, *a, **k):
        if step == "mode" and str(p).endswith("inbound"):
            raise OSError(FAILS[fail], os.strerror(FAILS[fail]), str(p))
        return real_chmod(p, *a, **k)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "chmod", chmod)
    rc, out, err = run(["class", "init", "cls", "--group", group])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and os.strerror(FAILS[fail]) in err, err
    assert "internal error" not in err and "[Errno" not in err
    monkeypatch.setattr(os, "mkdir", real_mkdir)
    monkeypatch.setattr(os, "chmod", real_chmod)
    rc, out, err = run(["class", "init", "cls", "--group", group])
    assert rc == 0, err
    assert dropbox.check(box / "cls") == box / "cls" / "inbound"


@pytest.fixture
def small_disk():
    """A real 64 KiB file system (tmpfs) that the test fills; root and a kernel that lets it mount, else skip."""
    d = Path(tempfile.mkdtemp(prefix="hwdisk", dir="/tmp"))
    import subprocess

    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        d.rmdir()
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield d
    subprocess.run(["umount", str(d)], check=True)
    d.rmdir()


def _fill(d: Path) -> None:
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_really_full_disk_sends_each_writer_to_the_rescue_folder(box, small_disk, lab_home, monkeypatch):
    """Real ENOSPC (a full tmpfs, the destination's folders made before it filled): bundle and drill
    new rescued, the working copy one line, no temporary file on the disk, no internal error."""
    (small_disk / "drills").mkdir()
    monkeypatch.setenv("HWLAB_HOME", str(small_disk / "home"))
    _fill(small_disk)
    for argv, rescued in ((["bundle", str(small_disk / "b.tar.gz"), "--no-doctor"], "bundle-*.tar.gz"),
                          (["drill", "new", "--dir", str(small_disk / "drills")], "drill-*.json"),
                          (LAB, None)):
        rc, out, err = run(argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert "No space left on device" in err and "internal error" not in err, err
        if rescued:
            assert list((box / "rescue").glob(rescued)) and "saved to" in err
        assert not [p for p in small_disk.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_real_file_size_limit_is_one_line_for_every_writer(tmp_path):
    """Real EFBIG: each writer in a process whose file-size limit (RLIMIT_FSIZE, ``ulimit -f``) is
    1 KiB, below any archive, drill or notebook; the rescue folder meets the same limit, so each line
    says nothing was kept, and no temporary file is left."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    env = {**os.environ, "HWLAB_RESCUE_DIR": str(tmp_path / "rescue"), "HWLAB_HOME": str(tmp_path / "home"),
           "HWLAB_CACHE": str(tmp_path / "cache")}
    for argv in (["bundle", "b.tar.gz", "--no-doctor"], ["drill", "new", "--dir", "drills"], LAB + ["--port", "18932"]):
        r = subprocess.run([sys.executable, "-m", "hwlab", *argv], cwd=tmp_path, env=env, preexec_fn=limit,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert "File too large" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
