"""The class deployment (deploy/): a real JupyterHub with its proxy, three learners and an instructor
as system users, notebook 01's checkpoint run in each learner's kernel through the hub, the class drop
box read by the instructor and closed to the other learners; the Slurm and Kubernetes configurations
loaded with their spawner classes.

The hub test needs root (useradd, the hub's setuid spawner), node/npm (the proxy, installed from npm
into a cache folder) and Debian's /usr/bin/python3. The learners' processes cannot run the kit's venv
where its interpreter lives under a home folder of mode 700 (pyenv in /root): the test makes a venv
from /usr/bin/python3 under /tmp that reads the kit venv's packages (a .pth line), adds JupyterHub
(the ``hub`` extra of pyproject.toml) where the kit venv lacks it, and serves a copy of the kit's
files; every part of it is readable by the learners.
"""
import asyncio
import grp
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CACHE = Path(os.environ.get("HWLAB_HUB_CACHE", "/tmp/hwlab-hub-cache"))
HUB_EXTRA = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hub"]


# ---- the Slurm and Kubernetes configurations, with their spawner classes ------------------------

def _load(path: Path, env: dict, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()


def test_slurm_config_asks_slurm_for_one_gpu_slice_per_learner(monkeypatch, tmp_path):
    batchspawner = pytest.importorskip("batchspawner", reason="the hub extra (batchspawner) is not installed")
    from jupyterhub.objects import Hub
    from types import SimpleNamespace

    me = pwd.getpwuid(os.getuid()).pw_name
    cfg = _load(DEPLOY / "jupyterhub_config_slurm.py",
                {"HWLAB_SLURM_PARTITION": "class-gpu", "HWLAB_SLURM_TIME": "01:30:00",
                 "HWLAB_SLURM_GPU": "gpu:1g.18gb:1", "HWLAB_KIT": "/opt/hwlab", "HWLAB_BIN": "/opt/hwlab/venv/bin",
                 "HWLAB_CLASS_DIR": "/srv/class", "HWLAB_HUB_STATE": str(tmp_path / "state")}, monkeypatch)
    assert cfg.JupyterHub.spawner_class == "batchspawner.SlurmSpawner"
    sp = batchspawner.SlurmSpawner(config=cfg, hub=Hub(),
                                   user=SimpleNamespace(name=me, url=f"/user/{me}/", escaped_name=me, server=None))
    sp.api_token = "t"
    subvars = sp.get_req_subvars()
    subvars["cmd"] = sp.cmd_formatted_for_batch()
    script = asyncio.run(sp._get_batch_script(**subvars))
    assert "#SBATCH --partition=class-gpu" in script and "#SBATCH --time=01:30:00" in script
    assert "#SBATCH --gres=gpu:1g.18gb:1" in script
    assert re.search(r"^srun /opt/hwlab/venv/bin/batchspawner-singleuser /opt/hwlab/venv/bin/hwlab hub singleuser --dir "
                     r"/opt/hwlab/notebooks$", script, re.M), script
    assert sp.get_env()["HWLAB_CLASS_DIR"] == "/srv/class"
    exported = re.search(r"--export=(\S+)", script).group(1).split(",")
    assert "HWLAB_KIT" in exported and "HWLAB_CLASS_DIR" in exported


def test_kubernetes_config_gives_each_pod_one_gpu_resource(monkeypatch, tmp_path):
    kubespawner = pytest.importorskip("kubespawner", reason="the hub extra (jupyterhub-kubespawner) is not installed")
    yaml = pytest.importorskip("yaml")
    from jupyterhub.objects import Hub
    from types import SimpleNamespace

    kube = tmp_path / "kubeconfig"  # a cluster that is never contacted: the pod is only built
    kube.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                                "users": [{"name": "u", "user": {"token": "t"}}],
                                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    # read once, at import, by kubernetes_asyncio
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(kube))
    cfg = _load(DEPLOY / "kubernetes" / "jupyterhub_config_k8s.py",
                {"HWLAB_GPU_RESOURCE": "nvidia.com/mig-1g.18gb",
                 "HWLAB_IMAGE": "registry.example/hwlab:1", "HWLAB_HUB_STATE": str(tmp_path / "state")}, monkeypatch)
    assert cfg.JupyterHub.spawner_class == "kubespawner.KubeSpawner"
    assert cfg.JupyterHub.authenticator_class == "github" and cfg.JupyterHub.services == []

    async def pod():
        sp = kubespawner.KubeSpawner(config=cfg, hub=Hub(), _mock=True,
                                     user=SimpleNamespace(name="ana", id=1, url="/user/ana/", escaped_name="ana",
                                                          server=None, orm_user=None))
        sp.api_token = "t"
        return await sp.get_pod_manifest()

    c = asyncio.run(pod()).spec.containers[0]
    assert c.image == "registry.example/hwlab:1"
    assert c.args[:3] == ["hwlab", "hub", "singleuser"] and c.args[-1] == "/opt/hwlab/notebooks"
    assert c.resources.limits["nvidia.com/mig-1g.18gb"] == "1" and c.resources.requests["nvidia.com/mig-1g.18gb"] == "1"
    assert "nvidia.com/gpu" not in c.resources.limits
    values = yaml.safe_load((DEPLOY / "kubernetes" / "values.yaml").read_text())["singleuser"]
    assert values["cmd"][:3] == ["hwlab", "hub", "singleuser"] and values["extraResource"]["limits"] == {"nvidia.com/gpu": "1"}


def test_kubernetes_values_log_in_with_a_real_authenticator_and_keep_each_learners_home():
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("oauthenticator", reason="the hub extra (oauthenticator) is not installed")
    from importlib.metadata import entry_points
    from jupyterhub.auth import Authenticator, DummyAuthenticator
    from traitlets.config import Config

    v = yaml.safe_load((DEPLOY / "kubernetes" / "values.yaml").read_text())
    conf = v["hub"]["config"]
    name = conf["JupyterHub"]["authenticator_class"]
    cls = entry_points(group="jupyterhub.authenticators")[name].load()
    assert issubclass(cls, Authenticator) and not issubclass(cls, DummyAuthenticator)
    auth = cls(config=Config(conf))
    for section in (cls.__name__, "Authenticator"):  # every key is a setting of that class: no typo ignored
        unknown = set(conf.get(section, {})) - set(cls.class_trait_names(config=True))
        assert not unknown, (section, unknown)
    assert auth.client_id and auth.client_secret and auth.allowed_organizations and auth.admin_users
    assert not auth.allow_all
    su = v["singleuser"]
    assert su["storage"]["type"] == "dynamic" and su["storage"]["homeMountPath"] == "/home/jovyan"

    # the image the values name: deploy/Dockerfile, read instruction by instruction
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    ins = [ln.split(None, 1) for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    ops = [op.upper() for op, *_ in ins]
    assert ops[0] in ("FROM", "ARG") and "FROM" in ops
    assert set(ops) <= {"FROM", "ARG", "RUN", "COPY", "ENV", "USER", "WORKDIR", "CMD", "LABEL", "EXPOSE"}
    user = [rest for op, rest in ins if op == "USER"][-1].strip()
    assert user not in ("0", "root") and re.search(rf"useradd .*--uid {user} .*jovyan", text)
    assert su["uid"] == int(user)
    assert json.loads([rest for op, rest in ins if op == "CMD"][-1]) == su["cmd"]
    env = " ".join(rest for op, rest in ins if op == "ENV")
    kit = su["extraEnv"]["HWLAB_KIT"]
    assert f"HWLAB_KIT={kit}" in env and su["cmd"][-1] == f"{kit}/notebooks"
    assert re.search(rf"^COPY (--\S+ )*\. {kit}$", text, re.M)
    extras = re.search(r'"/opt/hwlab\[([a-z,]+)\]"', text).group(1).split(",")
    known = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(known) and "hub" in extras
    assert "ipykernel install --prefix /opt/venv --name hwlab" in text and "/opt/venv/bin" in env


# ---- a real hub --------------------------------------------------------------------------------

def _readable_by_all(path: Path) -> bool:
    """Every folder on the way is searchable by others and ``path`` readable by them."""
    p = path.resolve()
    for d in [*reversed(p.parents), p]:
        m = d.stat().st_mode
        if not m & stat.S_IXOTH or (d == p and not m & stat.S_IROTH):
            return False
    return True


def _hub_venv() -> Path:
    """A venv from /usr/bin/python3 that every user can run, reading the kit venv's packages."""
    kit_site = Path(sysconfig.get_paths()["purelib"])
    if not _readable_by_all(kit_site):
        pytest.skip(f"the kit's packages ({kit_site}) are not readable by other users: install the kit "
                    "in a venv outside a private home folder to run the hub test")
    venv = CACHE / f"venv-{hashlib.sha256(repr((str(kit_site), HUB_EXTRA)).encode()).hexdigest()[:12]}"
    py = venv / "bin" / "python"
    if not (venv / ".done").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "hwlab-kit-venv.pth").write_text(f"{kit_site}\n")
        have = subprocess.run([str(py), "-c", "import jupyterhub"], capture_output=True).returncode == 0
        if not have:  # the kit venv lacks the hub extra: JupyterHub goes into this venv (pip from the kit venv)
            subprocess.run([str(py), "-m", "pip", "install", "-q", *HUB_EXTRA], check=True)
        subprocess.run([str(py), "-m", "ipykernel", "install", "--prefix", str(venv), "--name", "hwlab",
                        "--display-name", "hwlab (class)"], check=True, capture_output=True)
        subprocess.run(["chmod", "-R", "o+rX", str(venv)], check=True)
        (venv / ".done").write_text("")
    return venv


def _proxy() -> Path:
    chp = CACHE / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not chp.exists():
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(CACHE / "chp"),
                        "configurable-http-proxy@4"], check=True, capture_output=True, timeout=300)
    return chp


def _kit_copy(base: Path, venv: Path) -> Path:
    """The kit's files the learners' servers read, in a folder they can read, and ``hwlab`` in the venv."""
    kit = base / "kit"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("src", "notebooks", "exercises", "examples", "solutions"):
        shutil.copytree(ROOT / part, kit / part, ignore=ignore)
    (kit / "deploy").mkdir()
    for f in ("jupyterhub_config.py",):
        shutil.copy(DEPLOY / f, kit / "deploy" / f)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "hwlab-src.pth").write_text(f"{kit / 'src'}\n")
    (venv / "bin" / "hwlab").write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom hwlab.cli import main\n"
                                        "sys.exit(main())\n")
    os.chmod(venv / "bin" / "hwlab", 0o755)
    subprocess.run(["chmod", "-R", "o+rX", str(base)], check=True)
    return kit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"},
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
    return json.loads(text) if text else {}


async def _run_cells(base: str, user: str, token: str, cells: list[str]) -> str:
    """Run ``cells`` in a new ``hwlab`` kernel of ``user``'s server, through the hub's proxy; the text out."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    kernel = await asyncio.to_thread(_api, f"{base}/user/{user}/api/kernels", token, "POST", {"name": "hwlab"})
    ws = await websocket_connect(HTTPRequest(f"{base.replace('http', 'ws')}/user/{user}/api/kernels/{kernel['id']}"
                                             "/channels", headers={"Authorization": f"token {token}"}))
    out = []
    for code in cells:
        mid = secrets.token_hex(8)
        await ws.write_message(json.dumps({
            "header": {"msg_id": mid, "msg_type": "execute_request", "username": user, "session": mid,
                       "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False}}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), timeout=240))
            if msg.get("parent_header", {}).get("msg_id") != mid:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                out.append(c["text"])
            elif t == "error":
                out.append("\n".join(c["traceback"]))
            elif t == "status" and c["execution_state"] == "idle":
                break
    ws.close()
    return "".join(out)


def _as_user(name: str, argv: list[str], groups: list[int] = ()) -> subprocess.CompletedProcess:
    pw = pwd.getpwnam(name)
    return subprocess.run(argv, user=pw.pw_uid,
                          group=pw.pw_gid, extra_groups=list(groups), capture_output=True, text=True,
                          env={"HOME": pw.pw_dir, "PATH": "/usr/bin:/bin"}, timeout=60, cwd="/")


def _answer_cells(nb: dict, answer: str) -> list[str]:
    """Notebook 01's cells that lead to its checkpoint, from the learner's own copy: the imports, the
    evidence (recorded on a CPU machine) and the checkpoint, its blanks replaced by ``answer``."""
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    imports = code[0]
    ev = next(c for c in code if 'evidence.recorded("lab01_bandwidth")' in c)
    cp = next(c for c in code if 'nb.answer("01"' in c)
    assert "leaf=None, metric=None, value=None, prediction=None" in cp
    return [imports, ev, cp.replace("leaf=None, metric=None, value=None, prediction=None", answer)]


RIGHT = ('leaf="G", metric=(M := next(m for m in ("dram_pct_of_peak", "dram_pct_estimated") '
         'if m in result.evidence["unfused"])), value=float(result.evidence["unfused"][M]), prediction=3.0')
WRONG = 'leaf="L", metric="sm_busy_pct", value=50.0, prediction=1.0'
BLANK = "leaf=None, metric=None, value=None, prediction=None"


@pytest.mark.slow
def test_a_class_on_a_real_jupyterhub():
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("npm") \
            or not Path("/usr/bin/python3").exists():
        pytest.skip("the hub test needs root, useradd, npm and /usr/bin/python3")
    CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(CACHE, 0o755)
    venv, chp = _hub_venv(), _proxy()
    base = Path(tempfile.mkdtemp(prefix="hwlab-hub-", dir="/tmp"))
    os.chmod(base, 0o755)
    tag = secrets.token_hex(2)
    group, teach, learners = f"hwl{tag}g", f"hwl{tag}t", [f"hwl{tag}s{i}" for i in (1, 2, 3)]
    made_users, made_group, hub = [], False, None
    try:
        subprocess.run(["groupadd", group], check=True)
        made_group = True
        for u in [teach, *learners]:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", *(["-G", group] if u == teach else []), u], check=True)
            made_users.append(u)
        kit = _kit_copy(base, venv)
        hwlab = [str(venv / "bin" / "hwlab")]
        klass = base / "class"
        subprocess.run([*hwlab, "class", "init", str(klass), "--group", group], check=True, capture_output=True)
        port, token = _free_port(), secrets.token_hex(16)
        (base / "hub").mkdir()
        cfg = base / "hub" / "test_config.py"
        cfg.write_text(
            f"c = get_config()\nload_subconfig({str(kit / 'deploy' / 'jupyterhub_config.py')!r})\n"
            f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'\nc.JupyterHub.hub_port = {_free_port()}\n"
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{_free_port()}'\n"
            f"c.JupyterHub.services = [{{'name': 'classtest', 'api_token': {token!r}}}]\n"
            "c.JupyterHub.load_roles = [{'name': 'classtest', 'services': ['classtest'],"
            " 'scopes': ['admin:users', 'admin:servers', 'access:servers']}]\n")
        env = {**os.environ, "HWLAB_KIT": str(kit), "HWLAB_BIN": str(venv / "bin"), "HWLAB_CLASS_DIR": str(klass),
               "HWLAB_HUB_PROXY": str(chp), "HWLAB_HUB_STATE": str(base / "hub"), "HWLAB_GRADEBOOK": ""}
        env.pop("PYTHONPATH", None)
        log = open(base / "hub" / "hub.log", "w")
        hub = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyterhub", "-f", str(cfg)],
                               cwd=base / "hub", env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                _api(f"{url}/hub/api/", token)
                break
            except OSError:
                assert hub.poll() is None, (base / "hub" / "hub.log").read_text()[-3000:]
                time.sleep(0.5)
        for u in learners:
            _api(f"{url}/hub/api/users/{u}", token, "POST")
            _api(f"{url}/hub/api/users/{u}/server", token, "POST")
        for u in learners:
            for _ in range(240):
                srv = _api(f"{url}/hub/api/users/{u}", token).get("servers", {}).get("")
                if srv and srv.get("ready"):
                    break
                assert hub.poll() is None
                time.sleep(0.5)
            else:
                pytest.fail(f"{u}'s server never became ready:\n{(base / 'hub' / 'hub.log').read_text()[-3000:]}")
        # each learner's own working copy, served by the hub, on the hwlab kernel
        nb01 = [_api(f"{url}/user/{u}/api/contents/notebooks/01_bandwidth_bound.ipynb", token)["content"]
                for u in learners]
        assert all(n["metadata"]["kernelspec"]["name"] == "hwlab" for n in nb01)
        assert Path(pwd.getpwnam(learners[0]).pw_dir, ".local/share/hwlab/work").is_dir()

        async def all_three():
            return await asyncio.gather(*(_run_cells(url, u, token, _answer_cells(n, a))
                                          for u, n, a in zip(learners, nb01, (RIGHT, WRONG, BLANK))))
        outs = asyncio.run(all_three())
        assert "Traceback" not in "".join(outs), outs
        assert "checkpoint 01: passed" in outs[0] and "checkpoint 01: passed" not in outs[1], outs
        assert "fill in" in outs[2], outs[2]

        # the instructor's summary: three learners, counted per learner
        r = _as_user(teach, [*hwlab, "class", "summary", str(klass), "--json"], [grp.getgrnam(group).gr_gid])
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        people = s["per_learner"]
        assert sorted(people) == sorted(learners), people
        cp = [k for k in s["items"] if k.startswith("checkpoint:")]
        assert len(cp) == 1 and s["items"][cp[0]]["learners"] == 2 and s["items"][cp[0]]["learners_passed"] == 1
        assert people[learners[0]]["items"][cp[0]] == {"attempts": 1, "passed": True}
        assert people[learners[1]]["items"][cp[0]] == {"attempts": 1, "passed": False}
        assert people[learners[2]]["attempts"] == 0 and s["malformed"] == []

        # learner 2 cannot list the drop box, read learner 1's answer or replace it
        first = next(p for p in (klass / "inbound").iterdir()
                     if p.owner() == learners[0] and p.name.startswith("checkpoint-"))
        probe = (
            "import os, sys\nfrom pathlib import Path\nres = []\n"
            f"inbound, first = {str(klass / 'inbound')!r}, {str(first)!r}\n"
            "for what, fn in [('list', lambda: os.listdir(inbound)), ('read', lambda: open(first).read()),\n"
            "                 ('write', lambda: open(first, 'w').write('{}')),\n"
            "                 ('replace', lambda: (Path(inbound, 'mine.json').write_text('{}'),"
            " os.rename(Path(inbound, 'mine.json'), first))),\n"
            "                 ('delete', lambda: os.unlink(first))]:\n"
            "    try:\n        fn()\n        res.append(what + ' ALLOWED')\n"
            "    except PermissionError:\n        res.append(what + ' refused')\n"
            "print(' '.join(res))\n")
        r = _as_user(learners[1], ["/usr/bin/python3", "-c", probe])
        assert r.stdout.split() == ["list", "refused", "read", "refused", "write", "refused", "replace",
                                    "refused", "delete", "refused"], (r.stdout, r.stderr)
        assert json.loads(first.read_text())["learner"] == learners[0] and first.owner() == learners[0]
        r = _as_user(learners[1], [*hwlab, "class", "summary", str(klass)])
        assert r.returncode == 2 and "only the instructors" in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    finally:
        leftovers = _stop(hub, made_users, base)
        for u in made_users:
            subprocess.run(["userdel", "-r", u], capture_output=True)
        if made_group:
            subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    assert leftovers == [], f"processes left after the hub stopped: {leftovers}"


def _stop(hub: subprocess.Popen | None, users: list[str], base: Path) -> list[str]:
    """Stop the hub (SIGTERM: it stops the servers and its proxy); then list, and end by pid, any
    process the test's users or the proxy left."""
    if hub is None:
        return []
    proxy_pid = None
    pidfile = base / "hub" / "jupyterhub-proxy.pid"
    if pidfile.exists():
        proxy_pid = int(pidfile.read_text().strip())
    hub.send_signal(signal.SIGTERM)
    try:
        hub.wait(timeout=60)
    except subprocess.TimeoutExpired:
        hub.kill()
        hub.wait()
    uids = {pwd.getpwnam(u).pw_uid for u in users}
    deadline = time.monotonic() + 20  # the servers and kernels the hub stopped may take a moment to exit
    while True:
        live = _live_procs(uids, proxy_pid)
        if not live or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    left = []
    for pid, cmd in live:
        left.append(f"{pid}: {cmd[:120]}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _live_procs(uids: set[int], proxy_pid: int | None) -> list[tuple[int, str]]:
    """Processes of the test's users (or the proxy) still running: a zombie has exited (only its
    parent's reaping is left), so it is not one."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            uid = d.stat().st_uid
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if (uid in uids or int(d.name) == proxy_pid) and state != "Z":
            found.append((int(d.name), cmd))
    return found


def test_the_learners_server_command_takes_its_folder_and_refuses_a_wrong_one(tmp_path):
    hwlab = Path(sys.executable).parent / "hwlab"
    env = {**os.environ, "HWLAB_KIT": str(ROOT), "HWLAB_HOME": str(tmp_path / "home")}
    r = subprocess.run([str(hwlab), "hub", "singleuser", "--dir", str(tmp_path / "nope")], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 2 and str(tmp_path / "nope") in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home").exists()  # refused before any working copy is made
