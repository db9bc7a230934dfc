"""environment.yml (conda users) must ask for what pyproject.toml asks for."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in py["dependencies"]} | {
        _name(r) for r in py["optional-dependencies"]["dev"]}
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
