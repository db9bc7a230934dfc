"""A class drop box with nbgrader's exchange semantics: learners submit, only instructors list.

A class folder (``HWLAB_CLASS_DIR``) that holds an ``inbound/`` folder is a **drop box**; one
without it is a learner's own record folder, as before. The drop box is made by the instructor
(:func:`make`, ``hwlab class init DIR --group GROUP``) and is safe through file modes alone, as
nbgrader's exchange is, so it works on any shared file system that keeps POSIX modes:

* ``DIR`` mode 0o2751, owned by the instructor (or root), group GROUP: nobody but the owner
  renames or replaces ``inbound/``; learners pass through it (``o+x``) and never write it.
* ``DIR/inbound`` mode 0o3773: setgid (every file takes GROUP, the instructors' group), sticky
  (nobody deletes, renames or replaces a file they do not own), writable and searchable by
  everyone, **listable by the instructors only** (no r for other): a learner cannot see who
  else submitted. Learners must not be members of GROUP.
* each result is a new file, mode 0o640, owned by the learner who wrote it, group GROUP: the
  instructors read every file, other learners none. Its name ends in a random part (like
  nbgrader's ``+<random>``), so it cannot be guessed, and it is made with ``O_EXCL`` and linked
  under its name: an existing file is never replaced.

File modes cannot bound how much a learner puts into ``inbound/`` (disk quotas need root and a file
system that keeps them), so the per-learner quota (:data:`MAX_FILES_PER_LEARNER` entries and
:data:`MAX_BYTES_PER_LEARNER` bytes, by their sizes as the folder lists them) is enforced where the
instructor reads and cleans: :func:`usage` sums each owner's entries from ``lstat`` alone (nothing
opened); the summary reads none of an over-quota learner's files and says so; :func:`prune`
(``hwlab class prune DIR``) removes the entries that are not results or are over a result's size, then
that learner's newest ones past the quota. The sticky bit lets the drop box's owner remove any file in
it, so the owner must be the instructor, not root: ``hwlab class init DIR --group G --owner LOGIN`` as
root gives it to them.

The modes are **checked, not assumed**: before a learner writes and before the instructor reads,
:func:`check` refuses a drop box whose modes or types differ, with one line saying what to fix.
The learner of a result in a drop box is the login name of the process that wrote it; the
instructor's reading keeps only results whose ``learner`` field matches the file's owner
(another learner's name in a file is reported as malformed, not counted).
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any

from hwlab.errors import UserInputError

INBOUND = "inbound"
#: the drop box's inbound folder: setgid + sticky, rwx for the owner and the instructors' group,
#: wx (write, search, no list) for everyone else
INBOUND_MODE = stat.S_ISGID | stat.S_ISVTX | 0o773
#: the class folder: setgid, rwx owner, r-x group, --x other (learners pass through, do not list)
TOP_MODE = stat.S_ISGID | 0o751
#: a submitted result: the learner reads and writes it, the instructors' group reads it
FILE_MODE = 0o640
#: per learner in ``inbound/``: a result per graded answer (a few KiB each) over a course is a few hundred
#: files and well under a MiB; the quota leaves room for that and bounds what the summary reads per learner
MAX_FILES_PER_LEARNER = 1000
MAX_BYTES_PER_LEARNER = 8 << 20
#: a result over this is not one (:data:`hwlab.course.classroom.MAX_RESULT_BYTES`, repeated: no import up)
MAX_FILE_BYTES = 256 * 1024


def is_dropbox(folder: str | os.PathLike) -> bool:
    return os.path.isdir(Path(folder) / INBOUND)


def make(folder: str | os.PathLike, group: str, owner: str | None = None) -> Path:
    """Create (or tighten) the drop box ``folder`` for the instructors' ``group``; returns inbound.
    ``owner`` (root only): the instructor who owns it, so that they remove files from it (:func:`prune`)."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserInputError(f"no group {group!r} on this machine: make the instructors' group first "
                             "(groupadd) and pass it with --group") from None
    uid = -1
    if owner is not None:
        try:
            uid = pwd.getpwnam(owner).pw_uid
        except KeyError:
            raise UserInputError(f"--owner {owner!r}: no such user on this machine") from None
        if os.geteuid() != 0 and uid != os.geteuid():
            raise UserInputError("--owner: only root gives a drop box to another user; leave --owner out")
    top = Path(folder)
    inbound = top / INBOUND
    _refuse_shared(top, uid)
    for d, mode in ((top, TOP_MODE), (inbound, INBOUND_MODE)):
        d.mkdir(exist_ok=True)
        if d.is_symlink() or not d.is_dir():
            raise UserInputError(f"{d} is not a folder: choose a new class folder")
        os.chown(d, uid, gid)
        os.chmod(d, mode)
    check(top)
    return inbound


def _refuse_shared(top: Path, owner: int = -1) -> None:
    """An existing folder becomes a drop box only if it is this user's alone: one everybody may
    write (a shared 1777 folder such as /tmp) or one holding other users' files would become a
    drop box around files the instructors did not put there."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UserInputError(f"{top} is not a folder: choose a new class folder")
    if stat.S_IMODE(st.st_mode) & 0o002:
        raise UserInputError(f"{top} is writable by everyone (mode {stat.S_IMODE(st.st_mode):#o}): other users' "
                             "files may be in it already; choose a new class folder (it is created for you)")
    mine = {os.geteuid()} | ({owner} if owner >= 0 else set())  # root giving it to --owner: theirs too
    theirs = sorted(p.name for p in top.iterdir() if p.name != INBOUND and p.lstat().st_uid not in mine)
    if st.st_uid not in mine or theirs:
        who = f"holds files of other users ({', '.join(theirs[:3])})" if theirs else "belongs to another user"
        raise UserInputError(f"{top} {who}: choose a new class folder (it is created for you)")


def _mode_line(path: Path, st: os.stat_result, want: int, fix: str) -> str:
    return (f"class drop box {path} has mode {stat.S_IMODE(st.st_mode):#o}, not {want:#o}: the learners' "
            f"answers would not stay theirs; run `{fix}` (or hwlab class init) before the class uses it")


def check(folder: str | os.PathLike) -> Path:
    """The drop box's inbound folder, after checking both folders' types and modes; raises
    :class:`UserInputError` (one line) if any is wrong. Extra restrictions on the top folder
    (no group r-x) are accepted; anything that lets a learner list, replace or rename is not."""
    top = Path(folder)
    inbound = top / INBOUND
    for d in (top, inbound):
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            raise UserInputError(f"class drop box {d} is a link or a file, not a folder: point "
                                 f"HWLAB_CLASS_DIR at the folder `hwlab class init` made")
    st_top, st_in = os.lstat(top), os.lstat(inbound)
    m_top = stat.S_IMODE(st_top.st_mode)
    if m_top & 0o022 or not m_top & 0o001:  # nobody but the owner writes; others pass through
        raise UserInputError(_mode_line(top, st_top, TOP_MODE, f"chmod {TOP_MODE:o} {top}"))
    if stat.S_IMODE(st_in.st_mode) != INBOUND_MODE:
        raise UserInputError(_mode_line(inbound, st_in, INBOUND_MODE, f"chmod {INBOUND_MODE:o} {inbound}"))
    if st_in.st_uid != st_top.st_uid:
        raise UserInputError(f"class drop box {inbound} is owned by uid {st_in.st_uid}, its class folder by "
                             f"uid {st_top.st_uid}: both must be the instructor's (chown)")
    return inbound


def login_name() -> str:
    """The login name of this process: the learner of what it submits (not ``HWLAB_LEARNER``)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid{os.geteuid()}"


def submit(record: dict[str, Any], folder: str | os.PathLike, stem: str) -> Path:
    """Write ``record`` as a new file of this learner in the drop box (modes checked first)."""
    inbound = check(folder)
    text = json.dumps(record, indent=2, allow_nan=False) + "\n"
    path = inbound / f"{stem}-{secrets.token_hex(8)}.json"
    tmp = inbound / f".{path.name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE)
            os.fsync(f.fileno())
        os.link(tmp, path)  # never replaces: a name that exists raises FileExistsError
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return path


def private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is ``uid``'s own group (its primary group, with no other members)."""
    try:
        g, u = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    others = [m for m in g.gr_mem if m != u.pw_name] + [p.pw_name for p in pwd.getpwall()
                                                        if p.pw_gid == gid and p.pw_uid != uid]
    return u.pw_gid == gid and not others


def owner_name(path: Path) -> str:
    uid = os.lstat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def files(folder: str | os.PathLike) -> list[Path]:
    """The submitted results (the instructor's view; modes checked first)."""
    inbound = check(folder)
    try:
        names = os.listdir(inbound)
    except PermissionError:
        raise UserInputError(f"only the instructors' group lists the class drop box {inbound}: run hwlab class "
                             "summary as an instructor") from None
    return sorted(inbound / n for n in names if n.endswith(".json") and not n.startswith("."))


def usage(folder: str | os.PathLike) -> dict[int, dict[str, int]]:
    """Per owner (uid) of entries in ``inbound/``: files (every entry, hidden ones included) and bytes, from
    ``lstat`` alone (nothing opened, no link followed)."""
    inbound = check(folder)
    try:
        names = os.listdir(inbound)
    except PermissionError:
        raise UserInputError(f"only the instructors' group lists the class drop box {inbound}") from None
    out: dict[int, dict[str, int]] = {}
    for n in names:
        try:
            st = os.lstat(inbound / n)
        except FileNotFoundError:
            continue
        u = out.setdefault(st.st_uid, {"files": 0, "bytes": 0})
        u["files"] += 1
        u["bytes"] += st.st_size
    return out


def over_quota(folder: str | os.PathLike) -> dict[int, dict[str, int]]:
    """The owners over :data:`MAX_FILES_PER_LEARNER` or :data:`MAX_BYTES_PER_LEARNER`, with their usage."""
    return {uid: u for uid, u in usage(folder).items()
            if u["files"] > MAX_FILES_PER_LEARNER or u["bytes"] > MAX_BYTES_PER_LEARNER}


def prune(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """Remove what puts a learner over the quota: first their entries that are not results (not a
    regular ``*.json`` file, or over :data:`MAX_FILE_BYTES`), then their newest results past the quota.
    Run by the drop box's owner (the sticky bit lets the owner remove any file); returns what was
    removed (name, owner, bytes)."""
    inbound = check(folder)
    if os.geteuid() not in (0, os.lstat(inbound).st_uid):
        raise UserInputError(f"only the drop box's owner ({owner_name(inbound)}) removes learners' files from "
                             f"{inbound}: run this as them (as root: hwlab class init DIR --group G --owner LOGIN "
                             "gives the drop box to an instructor)")
    gone = []
    for uid in over_quota(folder):
        mine = []
        for n in os.listdir(inbound):
            try:
                st = os.lstat(inbound / n)
            except FileNotFoundError:
                continue
            if st.st_uid == uid:
                mine.append((n, st))
        keep = [(n, st) for n, st in mine if stat.S_ISREG(st.st_mode) and n.endswith(".json")
                and not n.startswith(".") and st.st_size <= MAX_FILE_BYTES]
        drop = [(n, st) for n, st in mine if (n, st) not in keep]
        keep.sort(key=lambda x: (x[1].st_mtime, x[0]))
        total = 0
        for i, (n, st) in enumerate(keep):
            total += st.st_size
            if i >= MAX_FILES_PER_LEARNER or total > MAX_BYTES_PER_LEARNER:
                drop.append((n, st))
        for n, st in drop:
            try:
                (os.rmdir if stat.S_ISDIR(st.st_mode) else os.unlink)(inbound / n)
                gone.append({"name": n, "owner": owner_name_of(uid), "bytes": st.st_size})
            except OSError as e:  # a learner's folder with files in it: its owner's or root's to empty
                gone.append({"name": n, "owner": owner_name_of(uid), "bytes": st.st_size,
                             "error": f"not removed ({e.strerror}): remove it as root"})
    return gone


def owner_name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"
