"""``hwlab class summary DIR [--json] [--plot PATH] [--force]``: the instructor's view of a class folder;
``hwlab class init DIR --group GROUP [--owner LOGIN]``: make DIR a class drop box (:mod:`hwlab.course.dropbox`);
``hwlab class prune DIR``: remove what puts a learner over the drop box's per-learner quota (as its owner);
``hwlab class serve GRADEBOOK [--group GROUP]``: the grading service the hub runs
(:mod:`hwlab.cli.gradeservice`). A folder the service keeps (:mod:`hwlab.course.gradebook`) is read as
the class record: graded on the server, read with bounded memory, no link followed.

The summary leaves out the instructors (the class folder's group and its owner) and prints only text
with its control characters replaced. What it writes (the plot) is private to the instructor (mode
0o600; umask 077 while writing).

Exit codes: 0 summary printed (malformed files are listed on stderr and skipped), 2 bad input
(no such folder, no results in it, a plot path that exists without ``--force``, is not
``.png``/``.svg``/``.pdf`` or lies in a folder that takes no new file) or a plot write that
failed after reading (the summary is printed, the plot kept in the rescue folder and its path
printed), 3 internal error.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import sys
from pathlib import Path

from hwlab.course import classroom, dropbox, gradebook
from hwlab.errors import EXIT_OK, UserInputError
from hwlab.errors import EXIT_USAGE
from hwlab.core.store import check_destination, rescue, write_atomic_with


def cmd_class(a) -> int:
    if a.action == "init":
        if not a.dir or not a.group:
            raise UserInputError("give the folder and the instructors' group: hwlab class init DIR --group GROUP")
        inbound = dropbox.make(a.dir, a.group, a.owner)
        print(f"class drop box ready: learners set {classroom.ENV_DIR}={a.dir}; they submit into {inbound} "
              f"and cannot list or read each other's files; group {a.group} reads them all")
        return EXIT_OK
    if a.action == "prune":
        if not a.dir or not dropbox.is_dropbox(a.dir):
            raise UserInputError("give the class drop box: hwlab class prune DIR (a folder hwlab class init made)")
        gone = dropbox.prune(a.dir)
        if a.json:
            print(json.dumps({"removed": gone}, indent=2))
        else:
            for g in gone:
                print(classroom.clean(f"{g['owner']}: {g['name']} ({g['bytes']} bytes) {g.get('error', 'removed')}"))
            print(f"{sum('error' not in g for g in gone)} file(s) removed; per learner the drop box keeps at most "
                  f"{dropbox.MAX_FILES_PER_LEARNER} files, {dropbox.MAX_BYTES_PER_LEARNER} bytes")
        return EXIT_USAGE if any("error" in g for g in gone) else EXIT_OK
    if a.action == "serve":
        from hwlab.cli import gradeservice

        if not a.dir:
            raise UserInputError("give the gradebook folder: hwlab class serve DIR [--group INSTRUCTORS]")
        return gradeservice.serve(a.dir, a.group)
    old_mask = os.umask(0o077)  # the instructor's outputs (plot, rescue copies) are theirs alone
    try:
        return _summary(a)
    finally:  # called in-process (tests, a notebook), the caller's umask comes back
        os.umask(old_mask)


def _summary(a) -> int:
    """``hwlab class summary`` (the module doc), under the caller's umask 077."""
    folder = Path(a.dir) if a.dir else classroom.class_dir()
    if folder is None:
        raise UserInputError(f"give the class folder: hwlab class summary DIR (or set {classroom.ENV_DIR})")
    plot = Path(a.plot) if a.plot else None
    if plot is not None:  # check the destination before reading anything
        if plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise UserInputError(f"--plot {plot}: give a .png, .svg or .pdf path")
        if not plot.parent.exists():
            raise UserInputError(f"--plot {plot}: the folder {plot.parent} does not exist")
        # a device, FIFO, folder or an existing file without --force is refused now (core.store)
        check_destination(plot, overwrite=a.force)
    if gradebook.is_gradebook(folder):
        results, bad = gradebook.read_all(folder)
    else:
        results, bad = classroom.load_results(folder)
    for b in bad:
        print(f"hwlab class: skipped {b['path']}: {b['why']}", file=sys.stderr)
    if not results:
        raise UserInputError(f"no graded results in {folder} ({len(bad)} malformed): learners write them "
                             f"when {classroom.ENV_DIR} points there, or with hwlab drill submit --class-dir")
    s = classroom.summary(results, exclude=instructors(folder))
    s["malformed"] = bad
    plot_err = None
    if plot is not None:  # checked above; if the write still fails, the plot goes to the rescue folder
        try:
            s["plot"] = str(write_atomic_with(plot, lambda tmp: classroom.plot(s, tmp), overwrite=a.force,
                                              suffix=plot.suffix.lower()))
        except OSError as e:
            plot_err = rescue(None, "class-plot", plot, e, suffix=plot.suffix.lower(),
                              write=lambda p: classroom.plot(s, p))
            s["plot"] = None
    if a.json:
        print(json.dumps(s, indent=2, allow_nan=False))
    else:
        print(classroom.render(s))
        if bad:
            print(f"{len(bad)} malformed file(s) skipped (listed on stderr)")
        if plot is not None and plot_err is None:
            print(f"plot written to {plot}")
    if plot_err:
        print(f"hwlab class: {plot_err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def instructors(folder: Path) -> set[str]:
    """For a drop box or a gradebook: its owner and the members of its group (the instructors' group of
    ``class init`` and of the gradebook), who are not learners, so not in the summary. A plain class
    folder (one person's record) leaves nobody out."""
    if not (dropbox.is_dropbox(folder) or gradebook.is_gradebook(folder)):
        return set()
    st = os.stat(folder)
    names = set()
    try:
        names.add(pwd.getpwuid(st.st_uid).pw_name)
    except KeyError:
        pass
    try:
        g = grp.getgrgid(st.st_gid)
    except KeyError:
        return names
    if g.gr_name in ("root", "users", "staff") and not g.gr_mem:
        return names
    return names | set(g.gr_mem)


def add_parser(sub) -> None:
    c = sub.add_parser("class", help="class results: attempts, pass rate, wrong leaves per exercise, fault and "
                       "checkpoint; leaves picked and evidence cited per checkpoint")
    c.add_argument("action", choices=["summary", "init", "serve", "prune"],
                   help="summary: the instructor's view; init: make DIR a drop box for --group (nbgrader's "
                        "exchange modes: learners submit, cannot list or read each other's files); prune: "
                        "remove what puts a learner over the drop box's quota (as its owner)")
    c.add_argument("--owner", help="init, as root: the instructor who owns the drop box (and may prune it)")
    c.add_argument("--group", help="init, serve: the instructors' group, which reads every submission")
    c.add_argument("dir", nargs="?", help=f"the class folder (default: ${classroom.ENV_DIR})")
    c.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    c.add_argument("--plot", metavar="PATH", help="also draw pass rate and wrong leaves (.png/.svg/.pdf)")
    c.add_argument("--force", action="store_true", help="replace --plot PATH if it exists")
    c.set_defaults(fn=cmd_class)
