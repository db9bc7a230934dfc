"""docs/INSTRUCTOR.md's commands, from an empty machine to learners logged in, run as they are written:
the shell block under "From an empty machine to ten learners logged in", in order, with only its
folders moved under a temporary one, its names made unique to this run, the kit cloned from this
checkout's committed HEAD, and ``apt-get`` left out where its packages are already on the machine;
then the hub it starts, and a learner logging in through the login form with the password the guide's
``chpasswd`` set. The install resolves from the machine's configured package sources (a wheel folder
here); it takes minutes. The shell gets the system PATH and the network's proxy and CA settings only.

Needs root, git, node/npm, Debian's /usr/bin/python3 and PAM; skips otherwise.
"""
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from test_hub import _free_port, _stop
from test_hub_login import _cookie, _login

ROOT = Path(__file__).resolve().parents[1]


def _guide_block() -> str:
    text = (ROOT / "docs" / "INSTRUCTOR.md").read_text()
    part = text.split("### From an empty machine to ten learners logged in", 1)[1]
    return re.search(r"```\n(.*?)```", part, re.S).group(1)


@pytest.mark.slow
def test_the_guides_commands_give_a_hub_where_a_learner_logs_in():
    tools = ("useradd", "chpasswd", "npm", "node", "git", "install")
    if os.geteuid() != 0 or not all(shutil.which(x) for x in tools) or not Path("/usr/bin/python3").exists() \
            or not Path("/etc/pam.d/login").exists():
        pytest.skip("needs root, useradd, chpasswd, git, node/npm, /usr/bin/python3 and PAM")
    if subprocess.run(["/usr/bin/python3", "-c", "import venv, ensurepip"], capture_output=True).returncode:
        pytest.skip("Debian's python3-venv is not installed")
    base = Path(tempfile.mkdtemp(prefix="hwlab-guide-", dir="/tmp"))
    os.chmod(base, 0o755)
    tag = secrets.token_hex(2)
    names = {"hwlab-learners": f"hwl{tag}l", "hwlab-instructors": f"hwl{tag}i", "hwlab-class": f"hwl{tag}c",
             "teacher": f"hwl{tag}t", "learner$i": f"hwl{tag}s$i"}
    block = _guide_block()
    start = block.index("cd /srv/hwlab-hub && ")
    setup, hub_cmd = block[:start], block[start:].replace("\\\n", " ").strip()
    # folders under the temporary one (the venv's name before the kit's), names unique to this run
    moves = [("/opt/hwlab-venv", base / "venv"), ("/opt/hwlab", base / "kit"), ("/srv/hwlab-hub", base / "hub"),
             ("/srv/hwlab-class", base / "class")]
    for old, new in moves:
        setup, hub_cmd = setup.replace(old, str(new)), hub_cmd.replace(old, str(new))
    for old, new in names.items():
        setup = re.sub(rf"(?<![\w/-]){re.escape(old)}(?![\w-])", new, setup)
    setup = setup.replace("KIT-REPOSITORY-URL", str(ROOT))
    lines = setup.splitlines()
    apt = next(i for i, ln in enumerate(lines) if ln.startswith("apt-get install"))
    if all(shutil.which(p) for p in ("node", "npm", "git")):
        lines[apt] = "true  # " + lines[apt]  # its packages are here already
    setup = "\n".join(lines)
    learners = [f"hwl{tag}s{i:02d}" for i in range(1, 11)]
    users = [names["teacher"], names["hwlab-class"], *learners]
    passwords = {u: secrets.token_urlsafe(12) for u in [names["teacher"], *learners]}
    (base / "passwords.txt").write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()))
    # a fresh machine's shell: the system PATH, and this network's own settings (its proxy and the CA
    # certificates its TLS needs, which npm and pip read from the environment)
    env = {"PATH": "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if re.search(r"(?i)(_CA_|CERT|SSL|PROXY|_CA$)", k)}}
    port = _free_port()
    hub = None
    try:
        r = subprocess.run(["bash", "-euxo", "pipefail", "-c", setup], cwd=base, env=env, capture_output=True,
                           text=True, timeout=1800)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
        # the settings whose defaults name the folders and names moved above (each file's header lists them)
        env_hub = {**env, "HWLAB_HUB_URL": f"http://127.0.0.1:{port}", "HWLAB_HUB_STATE": str(base / "hub"),
                   "HWLAB_GRADEBOOK": str(base / "class" / "gradebook"), "HWLAB_CLASS_USER": names["hwlab-class"],
                   "HWLAB_LEARNERS_GROUP": names["hwlab-learners"],
                   "HWLAB_INSTRUCTORS_GROUP": names["hwlab-instructors"]}
        argv = shlex.split(hub_cmd.split("&& ", 1)[1])
        while "=" in argv[0]:
            k, v = argv.pop(0).split("=", 1)
            env_hub[k] = v
        log = open(base / "hub.log", "w")
        hub = subprocess.Popen(argv, cwd=base / "hub", env=env_hub, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                code, jar = _login(url, learners[0], passwords[learners[0]])
                break
            except OSError:
                assert hub.poll() is None, (base / "hub.log").read_text()[-4000:]
                time.sleep(0.5)
        else:
            pytest.fail((base / "hub.log").read_text()[-4000:])
        assert code == 302 and _cookie(jar, "jupyterhub-hub-login"), (base / "hub.log").read_text()[-4000:]
        code, jar = _login(url, names["teacher"], passwords[names["teacher"]])
        assert code == 302
        for _ in range(120):
            if (base / "class" / "gradebook" / ".hwlab-gradebook").exists():
                break
            assert hub.poll() is None
            time.sleep(0.5)
        else:
            pytest.fail("the grading service never made its gradebook:\n" + (base / "hub.log").read_text()[-4000:])
    finally:
        made = [u for u in users if subprocess.run(["id", u], capture_output=True).returncode == 0]
        leftovers = _stop(hub, made, base) if hub else []
        for u in made:
            subprocess.run(["userdel", "-r", u], capture_output=True)
        for g in ("hwlab-learners", "hwlab-instructors"):
            subprocess.run(["groupdel", names[g]], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    assert leftovers == [], leftovers
