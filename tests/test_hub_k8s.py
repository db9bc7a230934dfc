"""deploy/kubernetes/values.yaml against the zero-to-jupyterhub chart's own values schema (4.4.0, vendored
under tests/data/z2jh with its source and licence, coalesced with the chart's defaults as Helm does), and
deploy/Dockerfile: built where a container builder answers, else its RUN steps run in a venv with the
folders moved under a temporary one (slow: it installs the kit)."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SCHEMA = ROOT / "tests" / "data" / "z2jh" / "values.schema.json"
DEFAULTS = ROOT / "tests" / "data" / "z2jh" / "values.yaml"


def _coalesce(defaults, mine):
    """Helm's merge of a values file over the chart's defaults: maps merged key by key, anything else
    (lists included) replaced, a null deleting the default."""
    if not isinstance(defaults, dict) or not isinstance(mine, dict):
        return mine
    out = dict(defaults)
    for k, v in mine.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _coalesce(defaults.get(k), v)
    return out


def _validator():
    """The schema's validator (draft-07): jsonschema where installed, else fastjsonschema."""
    schema = json.loads(SCHEMA.read_text())
    try:
        import jsonschema
    except ImportError:
        fastjsonschema = pytest.importorskip("fastjsonschema", reason="neither jsonschema nor fastjsonschema")

        check = fastjsonschema.compile(schema)

        def errors(v):
            try:
                check(v)
                return []
            except fastjsonschema.JsonSchemaException as e:
                return [e.message]
        return errors
    v = jsonschema.Draft7Validator(schema)
    return lambda values: [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(values)]


def test_the_values_pass_the_charts_schema_and_a_typo_or_the_dummy_login_does_not():
    yaml = pytest.importorskip("yaml")
    errors = _validator()
    mine = yaml.safe_load((DEPLOY / "kubernetes" / "values.yaml").read_text())
    values = _coalesce(yaml.safe_load(DEFAULTS.read_text()), mine)
    assert errors(values) == []
    assert errors(mine)  # the schema is read as Helm reads it: on the values coalesced with the defaults
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] not in ("dummy", "null")
    # the schema is strict where it matters: a misspelt key or a wrong type is refused
    typo = json.loads(json.dumps(values))
    typo["singleuser"]["storage"]["homeMountPth"] = "/home/jovyan"
    assert errors(typo)
    wrong = json.loads(json.dumps(values))
    wrong["singleuser"]["startTimeout"] = "ten minutes"
    assert errors(wrong)


def _dockerfile() -> tuple[dict[str, str], list[str], dict[str, str]]:
    """(ARG defaults, RUN commands, ENV settings) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    args, runs, env = {}, [], {}
    for ln in text.splitlines():
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        op, rest = ln.split(None, 1)
        if op == "ARG":
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip()
        elif op == "RUN":
            runs.append(rest)
        elif op == "ENV":
            for part in shlex.split(rest):
                k, _, v = part.partition("=")
                env[k] = v
    return args, runs, env


def _builder() -> str | None:
    """A container builder that answers (a docker client with no daemon is none)."""
    for b in ("docker", "podman"):
        if shutil.which(b) and subprocess.run([b, "info"], capture_output=True, timeout=60).returncode == 0:
            return b
    return None


@pytest.mark.slow
def test_the_dockerfiles_steps_install_the_kit_in_a_venv(tmp_path):
    builder = _builder()
    if builder:  # the image itself, where a builder runs (not tried on the machine this test was written on)
        tag = "hwlab-test:dockerfile"
        r = subprocess.run([builder, "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(ROOT)],
                           capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0, r.stderr[-3000:]
        r = subprocess.run([builder, "run", "--rm", tag, "hwlab", "hub", "singleuser", "--help"], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0 and "singleuser" in r.stdout + r.stderr, r.stderr[-2000:]
        return
    if subprocess.run([sys.executable, "-c", "import venv, ensurepip"], capture_output=True).returncode:
        pytest.skip("no venv/ensurepip for this Python")
    args, runs, env = _dockerfile()
    assert runs[0].startswith("useradd ") and "--uid 1000" in runs[0]  # the image's user: not made on this machine
    # the checkout as the image's COPY makes it (committed files), and the folders moved under tmp_path
    kit, venv = tmp_path / "hwlab", tmp_path / "venv"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(kit)], check=True)
    # the build arguments of a CPU image, as the Dockerfile's header gives them; torch's index is the
    # machine's own package source (pip's configuration), this machine having no other
    build = {**args, "CONSTRAINTS": "constraints-cpu.txt",
             "TORCH_INDEX": os.environ.get("PIP_INDEX_URL") or subprocess.run(
                 [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                 text=True).stdout.strip() or "https://pypi.org/simple"}
    for step in runs[1:]:
        cmd = step.replace("/opt/hwlab", str(kit)).replace("/opt/venv", str(venv))
        cmd = cmd.replace("python -m venv", f"{sys.executable} -m venv")
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], env={**os.environ, **build}, capture_output=True,
                           text=True, timeout=1800)
        assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    # what the image's CMD runs is there: hwlab with its hub command, the hwlab kernel, the notebooks
    cmd = json.loads(re.search(r"^CMD (.*)$", (DEPLOY / "Dockerfile").read_text(), re.M).group(1))
    assert cmd[0] == "hwlab" and (kit / cmd[-1].replace("/opt/hwlab/", "")).is_dir()
    # `hwlab hub --help` (the singleuser command itself would start a server and make a working copy)
    r = subprocess.run([str(venv / "bin" / cmd[0]), cmd[1], "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and cmd[2] in r.stdout, r.stderr[-2000:]
    assert shutil.which("jupyterhub-singleuser", path=str(venv / "bin")), "the server the command starts is missing"
    spec = json.loads((venv / "share" / "jupyter" / "kernels" / "hwlab" / "kernel.json").read_text())
    assert spec["display_name"] == "hwlab"
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import hwlab, jupyterhub, torch; print(torch.__version__)"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "+cu" not in r.stdout, r.stderr[-2000:]
    assert env["HWLAB_KIT"] == "/opt/hwlab" and env["PATH"].startswith("/opt/venv/bin:")
