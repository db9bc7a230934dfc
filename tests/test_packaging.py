"""Packaging: environment.yml (conda users) asks for what pyproject.toml asks for; the ranges
admit what the kit ran on; setup.sh installs everything and only its own kernel; a wheel built
from the tree ships the recorded evidence and works installed non-editable."""
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: extras the two README commands leave out on purpose: `grade` (nbgrader, for instructors who
#: grade with it; tests/test_nbgrader_course.py skips with the reason without it)
OPTIONAL_EXTRAS: set[str] = set()  # extras scripts/setup.sh may leave out (none today)


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in py["dependencies"]} | {
        _name(r) for extra, reqs in py["optional-dependencies"].items() if extra not in OPTIONAL_EXTRAS
        for r in reqs}
    env = (ROOT / "environment.yml").read_text()
    pip_block = env.split("- pip:", 1)[1]
    listed = {_name(m.group(1)) for m in re.finditer(r"^\s+-\s+([A-Za-z][A-Za-z0-9_.\-]*[^\n#]*)",
                                                     pip_block, re.M)}
    assert wanted - listed == set(), f"missing from environment.yml: {wanted - listed}"
    assert listed - wanted == set(), f"environment.yml asks for more: {listed - wanted}"
    assert "pynvml" not in listed, "use nvidia-ml-py (the PyPI pynvml package is deprecated)"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"```bash\n(.*?scripts/test\.sh.*?)\n```", readme, re.S)
    assert m, "README must show the test command"
    assert "scripts/test.sh" in ci


def _all_extras(py) -> set[str]:
    return {_name(r) for extra, reqs in py["optional-dependencies"].items() if extra not in OPTIONAL_EXTRAS
            for r in reqs}


def test_environment_yml_has_every_extra():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = (ROOT / "environment.yml").read_text().split("- pip:", 1)[1].lower()
    for name in _all_extras(py):
        assert f"- {name}" in env, f"environment.yml lacks {name} (an extra of pyproject.toml)"


def test_setup_installs_every_extra_and_its_own_kernel_only():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    m = re.search(r"-e '\.\[([a-z,]+)\]'", setup)
    assert m and set(m.group(1).split(",")) == set(py["optional-dependencies"]) - OPTIONAL_EXTRAS, \
        "scripts/setup.sh must install every extra (README's two commands install everything)"
    kernel_lines = [x for x in setup.splitlines() if "ipykernel install" in x]
    assert kernel_lines and all("--sys-prefix" in x and "--name hwlab" in x for x in kernel_lines), \
        "the kit's kernel is `hwlab`, inside .venv; it never replaces a user's kernel"
    assert "--user" not in setup and "--name python3" not in setup


def test_dependency_ranges_admit_the_versions_the_kit_ran_and_exclude_bad_triton():
    from packaging.requirements import Requirement

    deps = {Requirement(r).name: Requirement(r) for r in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    pins = dict(line.split("==") for line in (ROOT / "constraints-cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for name, version in pins.items():  # the CPU pins lie inside the ranges
        assert deps[name].specifier.contains(version), (name, version)
    assert deps["torch"].specifier.contains("2.11.0")  # the H200 image
    assert deps["triton"].specifier.contains("3.6.0")  # the H200 image
    assert not deps["triton"].specifier.contains("3.9.0")  # its ptxas rejects sm_90a
    assert not deps["torch"].specifier.contains("2.4.0")  # _scaled_mm returned a tuple, no CPU path


def _recorded_replay_cell() -> str:
    """The notebook cell that replays the H200 baseline records (notebook 05), with the
    notebook's imports in front of it."""
    import jupytext

    nb = jupytext.read(ROOT / "notebooks" / "05_node_baseline.py")
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    cell = next(c for c in code if 'evidence.recorded("baseline")' in c)
    imports = [ln for c in code for ln in c.splitlines() if ln.startswith(("from hwlab", "import "))]
    return "\n".join(imports) + "\n" + cell


@pytest.mark.slow
def test_wheel_installs_non_editable_and_replays_recorded_evidence(tmp_path):
    """Build the wheel from a copy of the tree, install it (not editable) into a fresh venv
    whose only other packages are this venv's (a .pth, `--no-index`: pip resolves the
    wheel's dependency ranges against them and downloads nothing), then run the CLI and a
    recorded-replay notebook cell from a folder outside the checkout."""
    import subprocess
    import zipfile

    from wheel_kit import build_wheel, install_in_fresh_venv

    run = lambda *cmd, **kw: subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # noqa: E731
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    recorded = {f"hwlab/{p.relative_to(ROOT / 'src' / 'hwlab').as_posix()}"
                for p in (ROOT / "src" / "hwlab" / "recorded").rglob("*") if p.is_file()}
    assert recorded and recorded <= names, f"wheel lacks {sorted(recorded - names)[:5]}"
    assert any(n.startswith("hwlab/recorded/traces/slow_link_tbf/") for n in names)  # exercise 05 reads it
    examples = {f"hwlab/examples/{p.name}" for p in (ROOT / "src" / "hwlab" / "examples").glob("*.py")}
    assert examples and examples <= names, f"wheel lacks {sorted(examples - names)[:5]}"  # notebook 08 reads them

    venv = tmp_path / "venv"
    py = install_in_fresh_venv(wheel, venv)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "HWLAB_RECORDED_DIR")}
    env["MPLBACKEND"] = "Agg"
    where = run(str(py), "-c", "import hwlab; print(hwlab.__file__)", cwd=work, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the wheel, not the checkout
    shown = run(str(venv / "bin" / "hwlab"), "evidence", "show", "doctor", cwd=work, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "RECORDED ON NVIDIA H200" in shown.stdout and "ceilings: copy" in shown.stdout
    cell = run(str(py), "-c", _recorded_replay_cell(), cwd=work, env=env)
    assert cell.returncode == 0, cell.stderr[-2000:]
    assert "[NVIDIA H200" in cell.stdout and "re-run vs baseline: matches the baseline" in cell.stdout


def test_readme_download_size_is_the_recorded_pypi_resolution():
    """The README's CPU download figure is the one pip's PyPI-alone dry-run measured
    (tools/results/install/pypi_cpu_resolution.json), re-derived from its wheel list."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import install_size
    finally:
        sys.path.pop(0)
    rec = json.loads((ROOT / "tools" / "results" / "install" / "pypi_cpu_resolution.json").read_text())
    s = install_size.summary(rec["wheels_mb"])
    assert s["n_wheels"] == rec["n_wheels"] and s["total_mb"] == rec["total_mb"]
    assert any(k.startswith("torch-") for k in rec["wheels_mb"])
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- pypi-size -->([\d.]+) GB of the ([\d.]+) GB", readme)
    assert m, "README must state the PyPI download size"
    assert float(m.group(1)) == round(s["torch_cuda_stack_mb"] / 1000, 2)
    assert float(m.group(2)) == round(s["total_mb"] / 1000, 2)
    # pip's own size lines parse as the record does (a kB and a GB line)
    assert install_size.wheels_mb("  Downloading a-1-py3-none-any.whl (11 kB)\n"
                                  "  Downloading b-2-py3-none-any.whl (1.5 GB)\n") == {
        "a-1-py3-none-any.whl": 0.011, "b-2-py3-none-any.whl": 1500.0}


def test_ci_proves_the_setup_install_resolves_from_pypi_alone():
    """CI runs setup.sh --check-pypi (the setup command's own spec and constraints, pip
    isolated from this machine's config, PyPI's index only) before the tests, under a timeout."""
    ci = (ROOT / ".ci" / "run").read_text()
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r"timeout \d+ bash scripts/setup\.sh --check-pypi", ci)
    assert ci.index("--check-pypi") < ci.index("bash scripts/test.sh")
    check = setup.split('if [ "${1:-}" = "--check-pypi" ]; then', 1)[1].split("\nfi\n", 1)[0]
    assert "--isolated" in check and "--index-url https://pypi.org/simple" in check and "--dry-run" in check
    assert '"${constraints[@]}" "${spec[@]}"' in check  # the same arguments as the install below
    assert 'check "a plain pip install ." .' in check  # and the README's library-only install
    assert setup.count('"${constraints[@]}" "${spec[@]}"') == 2
