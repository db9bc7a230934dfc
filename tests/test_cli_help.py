"""First contact: the front door (`hwlab` alone and `hwlab --help` map what you have to a
command, with an example that runs), every subcommand's real --help (found by walking the
parser, so a subcommand added later is checked too: every option described, the exit codes at
the end, no docstring markup), and `hwlab` in a new login shell after scripts/link_cli.sh."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hwlab import cli
from hwlab.diagnosis.flowchart import LEAVES

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _commands(parser=None, path=()):
    """(path, parser) of every subcommand, however deep, from the real parser."""
    parser = parser or cli.build_parser()
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sp in act.choices.items():
                yield (*path, name), sp
                yield from _commands(sp, (*path, name))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_subcommand_help_describes_every_option_and_ends_with_the_exit_codes(capsys):
    seen = 0
    for path, parser in _commands():
        out = _help(list(path), capsys)
        flat = _flat(out)
        where = "hwlab " + " ".join(path)
        assert re.search(r"exit codes: 0 ok; 1 a finding.*2 bad input.*3 internal error.*4 undecided", flat), where
        assert not re.search(r"``|:(mod|func|class|data|meth|attr):`", out), (where, out)
        for act in parser._actions:
            if isinstance(act, (argparse._HelpAction, argparse._VersionAction)):
                continue
            name = act.option_strings[0] if act.option_strings else (act.metavar or act.dest)
            assert act.help and act.help != argparse.SUPPRESS, f"{where} {name}: no description"
            if isinstance(act, argparse._SubParsersAction):
                continue  # its choices are listed, each with its own help
            shown = _flat(act.help % {"default": act.default, "prog": parser.prog})[:40]
            assert shown in flat, f"{where} {name}: its description is not in the help output"
        seen += 1
    assert seen >= 13  # every command of the front door and more: the walk found the parser's commands


def test_hwlab_alone_and_help_open_with_what_you_have_to_which_command(capsys):
    assert cli.main([]) == 0
    alone = capsys.readouterr().out
    assert alone == _help([], capsys)
    first = alone.split("usage:")[0]
    assert "What do you have? -> which command" in first.splitlines()[0]
    examples = [x.strip() for x in first.splitlines() if x.startswith("      hwlab ")]
    # a slow job, a slow rank, a trace, a model, a machine: one example line each
    for command in ("hwlab baseline compare", "hwlab ranks", "hwlab examine --trace", "hwlab examine", "hwlab doctor"):
        assert any(x.startswith(command) for x in examples), (command, examples)
    assert max(map(len, first.splitlines())) <= 80
    # the symptoms a newcomer brings each have their line: a node against its siblings (the fleet
    # table: three records or more), before and after an upgrade, precision and FP8, a run directory
    assert any(x.startswith("hwlab baseline compare") and len(x.split()) >= 6 for x in examples)
    for word in ("siblings", "upgrade", "FP8", "RUN_DIR: what hwlab.core.capture"):
        assert word in first, word
    # the examples are named by their package path: importable from any folder, not only the checkout
    import importlib
    assert sum("hwlab.examples." in x for x in examples) >= 2
    for x in examples:
        target = next((w for w in x.split()[2:] if ":" in w and not w.startswith("-")), None)
        if target and target.split(":")[0].startswith("hwlab."):
            mod = importlib.import_module(target.split(":")[0])
            assert callable(getattr(mod, target.split(":")[1]))
    # every command the front door names exists
    names = {p[0] for p, _ in _commands()}
    for word in re.findall(r"hwlab (\w+)", first):
        assert word in names, word


def test_the_two_trace_commands_point_to_each_other_in_their_help(capsys):
    examine = _flat(_help(["examine"], capsys))
    ranks = _flat(_help(["ranks"], capsys))
    assert "hwlab ranks --traces DIR" in examine and "hwlab examine --trace FILE" in ranks


def test_leaf_lists_the_leaves(capsys):
    out = _flat(_help(["drill"], capsys))
    for leaf_id, leaf in LEAVES.items():
        assert f"{leaf_id} {leaf.title}" in out


@pytest.mark.slow  # a subprocess: the command as a user types it
def test_hwlab_alone_from_a_shell_shows_the_front_door():
    r = subprocess.run([str(BIN / "hwlab")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("hwlab: hardware-aware")


@pytest.mark.slow  # bash login shells and a CLI start-up
@pytest.mark.parametrize("profile", ["none", "debian"])
def test_after_link_cli_a_new_login_shell_runs_hwlab(tmp_path, profile):
    """A temporary HOME: with a Debian-style ~/.profile (it puts ~/.local/bin on the PATH when the
    folder exists) the command works at once; with none, the one line printed makes it work."""
    home = tmp_path / "home"
    home.mkdir()
    if profile == "debian":
        (home / ".profile").write_text('if [ -d "$HOME/.local/bin" ] ; then\n    PATH="$HOME/.local/bin:$PATH"\nfi\n')
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "SHELL": "/bin/bash"}
    new_shell = ["env", "-i", f"HOME={home}", "bash", "-lc", "hwlab --version"]
    if subprocess.run(new_shell, capture_output=True, text=True).returncode == 0:
        pytest.skip("this machine's login shells already find an hwlab outside HOME")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "link_cli.sh")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (home / ".local" / "bin" / "hwlab").resolve() == (ROOT / ".venv" / "bin" / "hwlab").resolve()
    if profile == "none":
        line = r.stdout.strip().splitlines()[-1].strip()
        assert line.startswith("echo ") and ">> " in line, r.stdout
        subprocess.run(["bash", "-c", line], env=env, check=True)  # the user runs the printed line
    else:
        assert "ready in new shells" in r.stdout
    s = subprocess.run(new_shell, capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and s.stdout.startswith("hwlab "), (s.stdout, s.stderr)
    again = subprocess.run(["bash", str(ROOT / "scripts" / "link_cli.sh")], capture_output=True, text=True,
                           env=env, timeout=60)
    assert again.returncode == 0 and "ready in new shells" in again.stdout


@pytest.mark.slow  # bash login shells
def test_link_cli_says_when_another_checkouts_link_is_off_the_path(tmp_path):
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    other = tmp_path / "other" / "hwlab"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\necho other\n")
    other.chmod(0o755)
    (home / ".local" / "bin" / "hwlab").symlink_to(other)
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "SHELL": "/bin/bash"}
    if subprocess.run(["env", "-i", f"HOME={home}", "bash", "-lc", "command -v hwlab"],
                      capture_output=True, text=True).returncode == 0:
        pytest.skip("this machine's login shells already find an hwlab outside HOME")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "link_cli.sh")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0 and "not this checkout's" in r.stdout
    assert "not on your new shells' PATH" in r.stdout and ".local/bin" in r.stdout
    assert (home / ".local" / "bin" / "hwlab").resolve() == other  # left as it is
