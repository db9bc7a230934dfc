"""The one reader of files a user names (store.read_user_text / read_user_json): every refusal is
one line naming the file, what it is, and what to do; the caller's error class is raised."""
import os
from pathlib import Path

import pytest

from hwlab.errors import UserInputError
from hwlab.core.evidence import EvidenceError
from hwlab.core.store import read_user_json, read_user_text

HINT = "pass a saved thing"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\t\n")
    (tmp_path / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    (tmp_path / "bad.json").write_text('{"a": 1,\n "b": ')
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}')
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("name,expect", [
    ("missing.txt", "thing file {p} does not exist: check the path"),
    ("folder", "thing file {p} is a folder: " + HINT),
    ("empty.txt", "thing file {p} is empty: " + HINT),
    ("binary.txt", "thing file {p} is not text (binary data): " + HINT),
    ("empty.txt/x", "cannot read thing file {p} (Not a directory): " + HINT),
])
def test_each_refusal_is_one_line_saying_what_to_do(files, name, expect):
    p = files / name
    with pytest.raises(UserInputError) as e:
        read_user_text(p, "thing file", HINT)
    assert str(e.value) == expect.format(p=p)
    assert "\n" not in str(e.value)


def test_unreadable_file_says_check_permissions(files, monkeypatch):
    real_open = os.open
    target = str(files / "ok.json")

    def denied(path, *a, **k):  # as a file the user may not read (root reads through chmod)
        if str(path) == target:
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(UserInputError, match=r"cannot read thing file .*\(Permission denied\): check its permissions"):
        read_user_text(files / "ok.json", "thing file", HINT)


def test_json_variant_says_where_parsing_stopped(files):
    assert read_user_json(files / "ok.json", "thing file", HINT) == {"a": [1, 2]}
    with pytest.raises(UserInputError, match=r"is not valid JSON \(line 2, column 7: .*\); it may be "
                                             r"truncated: pass a saved thing$"):
        read_user_json(files / "bad.json", "thing file", HINT)


def test_the_callers_error_class_is_raised(files):
    for name in ("missing.txt", "folder", "empty.txt", "binary.txt", "bad.json"):
        with pytest.raises(EvidenceError):
            read_user_json(files / name, "evidence file", HINT, error=EvidenceError)
    assert read_user_text(files / "ok.json", "x", HINT) == '{"a": [1, 2]}'


# ---------------------------------------------------------------- JSON nested past any record
@pytest.mark.parametrize("depth", [100_000, 500])
@pytest.mark.parametrize("cmd", [["evidence", "show", "--json"], ["baseline", "compare"]])
def test_json_nested_too_deep_is_one_line_exit_2(tmp_path, capsys, depth, cmd):
    """A baseline record with one field nested ``depth`` deep: 100k levels exhaust the parser's
    recursion, 500 parse and then exhaust the recursive walks that print a record (both were exit
    3, RecursionError). Refused where the file is read: one line, exit 2."""
    import json

    from hwlab.cli import main
    from hwlab.core.evidence import RECORDED_DIR

    text = (RECORDED_DIR / "h200" / "baseline.json").read_text()
    d = json.loads(text)
    d["extra"]["deep"] = "DEEP"
    f = tmp_path / "deep.json"
    f.write_text(json.dumps(d).replace('"DEEP"', "[" * depth + "]" * depth))
    rc = main([*cmd[:2], str(f)] + ([str(f)] if cmd[0] == "baseline" else []) + cmd[2:])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "nested deeper than" in err and str(f) in err, err
