"""deploy/jupyterhub_config_slurm.py end to end against stand-in Slurm commands: a learner logs in through
the hub's login form, the hub submits their server as a batch job, the stand-in ``sbatch`` runs the job
script as the learner with only the environment the script exports (as Slurm's ``--export=LIST`` does:
no PATH), ``squeue`` reports it running on this host, the server becomes ready through the hub, and
stopping it cancels the job (``scancel``). The stand-ins stand for a cluster; what they run (the batch
script batchspawner writes from the config, the venv's ``batchspawner-singleuser``, ``hwlab hub
singleuser``) is the real thing. The test's config only names the stand-ins' paths and runs them as
the learner with ``runuser`` (a real site uses batchspawner's default ``sudo -E -u``).

Needs what tests/test_hub_login.py needs, and batchspawner (the hub extra); skips otherwise.
"""
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from test_hub import _api, _free_port, _hub_venv, _kit_copy, _proxy, _stop, CACHE, DEPLOY
from test_hub_login import _login, _cookie

SBATCH = r'''#!/usr/bin/python3
"""stand-in sbatch --parsable: the script on stdin, run as this user, detached, with only --export's names"""
import os, re, secrets, subprocess, sys
script = sys.stdin.read()
opt = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.M))
keep = [k for k in opt.get("export", "").split(",") if k and k != "NONE"]
env = {k: os.environ[k] for k in keep if k in os.environ}
job = str(secrets.randbelow(10**6) + 1)
env["SLURM_JOB_ID"] = job
state = os.path.join(STATE, job)
out = opt.get("output", os.devnull).replace("%j", job)
p = subprocess.Popen(["/bin/bash", "-c", script], env=env, cwd=opt.get("chdir", "/"), start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=open(out, "ab"), stderr=subprocess.STDOUT)
open(state, "w").write(str(p.pid))
print(job)
'''
SQUEUE = r'''#!/usr/bin/python3
"""stand-in squeue -h -j JOB -o '%T %B': RUNNING on this host while the job's process lives"""
import os, sys
job = sys.argv[sys.argv.index("-j") + 1]
try:
    pid = int(open(os.path.join(STATE, job)).read())
    os.kill(pid, 0)
    st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    if st != "Z":
        print("RUNNING 127.0.0.1")
except (OSError, ValueError):
    pass
'''
SCANCEL = r'''#!/usr/bin/python3
"""stand-in scancel JOB: the job's process group ends"""
import os, signal, sys
pid = int(open(os.path.join(STATE, sys.argv[1])).read())
try:
    os.killpg(pid, signal.SIGTERM)
except ProcessLookupError:
    pass
'''
SRUN = '#!/bin/sh\nexec "$@"\n'


@pytest.mark.slow
def test_a_learners_server_runs_as_a_slurm_job_with_only_the_exported_environment():
    if os.geteuid() != 0 or not all(shutil.which(x) for x in ("useradd", "chpasswd", "npm", "runuser")) \
            or not Path("/usr/bin/python3").exists() or not Path("/etc/pam.d/login").exists():
        pytest.skip("needs root, useradd, chpasswd, runuser, npm, /usr/bin/python3 and PAM")
    CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(CACHE, 0o755)
    venv, chp = _hub_venv(), _proxy()
    if subprocess.run([str(venv / "bin" / "python"), "-c", "import batchspawner.singleuser"],
                      capture_output=True).returncode:
        pytest.skip("batchspawner (the hub extra) is not installed")
    base = Path(tempfile.mkdtemp(prefix="hwlab-slurm-", dir="/tmp"))
    os.chmod(base, 0o755)
    tag = secrets.token_hex(2)
    lgroup, igroup, learner = f"hwl{tag}l", f"hwl{tag}i", f"hwl{tag}s"
    password = secrets.token_urlsafe(12)
    made_users, made_groups, hub = [], [], None
    try:
        for g in (lgroup, igroup):
            subprocess.run(["groupadd", g], check=True)
            made_groups.append(g)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-G", lgroup, learner], check=True)
        made_users.append(learner)
        subprocess.run(["chpasswd"], input=f"{learner}:{password}\n", text=True, check=True)
        kit = _kit_copy(base, venv)
        shutil.copy(DEPLOY / "jupyterhub_config_slurm.py", kit / "deploy")
        bsu = venv / "bin" / "batchspawner-singleuser"
        if not bsu.exists():  # the kit venv's copy, as a script of this venv
            bsu.write_text(f"#!{venv / 'bin' / 'python'}\nfrom batchspawner.singleuser import main\nmain()\n")
            bsu.chmod(0o755)
        standin, jobs = base / "slurm", base / "jobs"
        standin.mkdir()
        jobs.mkdir()
        os.chmod(jobs, 0o1777)
        for name, text in (("sbatch", SBATCH), ("squeue", SQUEUE), ("scancel", SCANCEL), ("srun", SRUN)):
            if name != "srun":  # the jobs' folder, named at the top of each stand-in
                first, rest = text.split("\n", 1)
                text = f"{first}\nSTATE = {str(jobs)!r}\n{rest}"
            (standin / name).write_text(text)
            (standin / name).chmod(0o755)
        port, admin_token = _free_port(), secrets.token_hex(16)
        cfg = base / "test_config.py"
        cfg.write_text(
            f"c = get_config()\nload_subconfig({str(kit / 'deploy' / 'jupyterhub_config_slurm.py')!r})\n"
            f"c.JupyterHub.hub_port = {_free_port()}\n"
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{_free_port()}'\n"
            "c.SlurmSpawner.exec_prefix = 'runuser -u {username} --'\n"
            f"c.SlurmSpawner.batch_submit_cmd = '{standin}/sbatch --parsable'\n"
            f"c.SlurmSpawner.batch_query_cmd = \"{standin}/squeue -h -j {{job_id}} -o '%T %B'\"\n"
            f"c.SlurmSpawner.batch_cancel_cmd = '{standin}/scancel {{job_id}}'\n"
            f"c.SlurmSpawner.req_srun = '{standin}/srun'\n"
            "c.SlurmSpawner.start_timeout = 240\n"
            f"c.JupyterHub.services = [{{'name': 'classtest', 'api_token': {admin_token!r}}}]\n"
            "c.JupyterHub.load_roles = [{'name': 'classtest', 'services': ['classtest'],"
            " 'scopes': ['admin:users', 'admin:servers', 'access:servers']}]\n")
        env = {**os.environ, "HWLAB_KIT": str(kit), "HWLAB_BIN": str(venv / "bin"), "HWLAB_HUB_PROXY": str(chp),
               "HWLAB_LEARNERS_GROUP": lgroup, "HWLAB_INSTRUCTORS_GROUP": igroup, "HWLAB_HUB_STATE": str(base / "hub"),
               "HWLAB_HUB_URL": f"http://127.0.0.1:{port}", "HWLAB_GRADEBOOK": ""}
        env.pop("PYTHONPATH", None)
        env.pop("HWLAB_CLASS_DIR", None)
        log = open(base / "hub.log", "w")
        hub = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyterhub", "-f", str(cfg)],
                               cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        hublog = lambda: (base / "hub.log").read_text()[-5000:]  # noqa: E731
        for _ in range(240):
            try:
                _api(f"{url}/hub/api/", admin_token)
                break
            except OSError:
                assert hub.poll() is None, hublog()
                time.sleep(0.5)
        code, jar = _login(url, learner, password)
        assert code == 302 and _cookie(jar, "jupyterhub-hub-login"), (code, hublog())
        _api(f"{url}/hub/api/users/{learner}/server", admin_token, "POST")
        for _ in range(480):
            srv = _api(f"{url}/hub/api/users/{learner}", admin_token).get("servers", {}).get("")
            if srv and srv.get("ready"):
                break
            assert hub.poll() is None, hublog()
            time.sleep(0.5)
        else:
            joblogs = "".join(p.read_text()[-3000:] for p in Path(pwd.getpwnam(learner).pw_dir).glob("jupyterhub_*"))
            pytest.fail(f"the job's server never became ready:\n{hublog()}\n--- job log ---\n{joblogs}")
        (job,) = os.listdir(jobs)
        pid = int((jobs / job).read_text())
        st = Path(f"/proc/{pid}")
        assert st.stat().st_uid == pwd.getpwnam(learner).pw_uid  # the job runs as the learner
        job_env = dict(x.split("=", 1) for x in (st / "environ").read_bytes().decode().split("\0") if "=" in x)
        assert "PATH" not in job_env and job_env["SLURM_JOB_ID"] == job and "JUPYTERHUB_API_TOKEN" in job_env
        # the server answers through the hub's proxy
        api = _api(f"{url}/user/{learner}/api/status", admin_token)
        assert "kernels" in api or "started" in api, api
        _api(f"{url}/hub/api/users/{learner}/server", admin_token, "DELETE")
        for _ in range(120):
            if subprocess.run([str(standin / "squeue"), "-h", "-j", job], capture_output=True, text=True).stdout == "":
                break
            time.sleep(0.5)
        else:
            pytest.fail("the job still runs after its server was stopped (scancel)")
        assert stat.S_IMODE(Path(pwd.getpwnam(learner).pw_dir).stat().st_mode) == 0o700
    finally:
        leftovers = _stop(hub, made_users, base) if hub else []
        for u in made_users:
            subprocess.run(["userdel", "-r", u], capture_output=True)
        for g in made_groups:
            subprocess.run(["groupdel", g], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    assert leftovers == [], f"processes left after the hub stopped: {leftovers}"
