"""JupyterHub configuration for a class on the hwlab kit (JupyterHub 5/6, local users).

Load it as it is (``jupyterhub -f deploy/jupyterhub_config.py``, as root: the hub starts each
learner's server as that learner); the Slurm and Kubernetes files beside it load this one first and
change only the spawner and the login. ``docs/INSTRUCTOR.md`` goes from an empty machine to learners
logged in. Settings (environment of the hub):

  HWLAB_KIT              the kit's checkout (holds notebooks/); default: the folder above deploy/
  HWLAB_BIN              the bin/ of the venv the kit is installed in, readable and runnable by every
                         learner (not under a home folder of mode 700); default: the hub's own venv
  HWLAB_LEARNERS_GROUP   the system group whose members may log in as learners (default hwlab-learners)
  HWLAB_INSTRUCTORS_GROUP  the system group of the instructors: they log in as the hub's admins
                         (default hwlab-instructors). Nobody outside the two groups logs in, whatever
                         their password (JupyterHub 5+ refuses everyone unless allowed).
  HWLAB_HUB_STATE        the hub's own folder (database, cookie secret, proxy pid): made mode 0700,
                         so its tokens stay the hub's (default /srv/hwlab-hub)
  HWLAB_HUB_URL          where learners reach the hub (default http://0.0.0.0:8000)
  HWLAB_HUB_PROXY        the configurable-http-proxy command; default: found on PATH, else under
                         HWLAB_HUB_STATE/node_modules/.bin (``npm install --prefix HWLAB_HUB_STATE
                         configurable-http-proxy``)
  HWLAB_CLASS_USER       the class's own account, which runs the grading service and owns the
                         gradebook (default hwlab-class); unset HWLAB_GRADEBOOK to run no service
  HWLAB_GRADEBOOK        the gradebook folder the service keeps (default /srv/hwlab-class/gradebook)
  HWLAB_GRADER_PORT      the service's port on this host (default 10101)
  HWLAB_CLASS_DIR        a class drop box (``hwlab class init``) for results the service does not
                         grade yet (exercise checks, drills); unset: none
  HWLAB_HUB_AUTH         the authenticator class; default: JupyterHub's PAM (the machine's logins)

Each learner's server is ``hwlab hub singleuser`` (``src/hwlab/cli/cmd_hub.py``): the learner's home
made private (mode 0700) and umask 077, their own working copy of the notebooks, the ``hwlab`` kernel
as the default, then ``jupyterhub-singleuser`` on that copy. Checkpoint answers go to the grading
service (``hwlab class serve``), which the hub starts as HWLAB_CLASS_USER: it grades them again and
keeps the record where learners cannot write.
"""
import os
import shutil
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

KIT = os.environ.get("HWLAB_KIT") or str(Path(__file__).resolve().parents[1])
BIN = os.environ.get("HWLAB_BIN") or os.path.dirname(sys.executable)
CLASS_DIR = os.environ.get("HWLAB_CLASS_DIR")
LEARNERS = os.environ.get("HWLAB_LEARNERS_GROUP", "hwlab-learners")
INSTRUCTORS = os.environ.get("HWLAB_INSTRUCTORS_GROUP", "hwlab-instructors")
STATE = Path(os.environ.get("HWLAB_HUB_STATE", "/srv/hwlab-hub"))
GRADEBOOK = os.environ.get("HWLAB_GRADEBOOK", "/srv/hwlab-class/gradebook")
CLASS_USER = os.environ.get("HWLAB_CLASS_USER", "hwlab-class")
GRADER_PORT = int(os.environ.get("HWLAB_GRADER_PORT", "10101"))
SERVICE = "hwlab-grader"

# ---- who logs in: the two groups, nobody else; instructors are the hub's admins ----
c.JupyterHub.authenticator_class = os.environ.get("HWLAB_HUB_AUTH", "pam")
c.Authenticator.allowed_groups = {LEARNERS, INSTRUCTORS}
c.PAMAuthenticator.admin_groups = {INSTRUCTORS}
c.Authenticator.allow_all = False

# ---- the hub's own state, private ----
STATE.mkdir(mode=0o700, parents=True, exist_ok=True)
os.chmod(STATE, 0o700)
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.bind_url = os.environ.get("HWLAB_HUB_URL", "http://0.0.0.0:8000")

# ---- the proxy: named, else on PATH, else installed into the state folder by npm ----
proxy = (os.environ.get("HWLAB_HUB_PROXY") or shutil.which("configurable-http-proxy")
         or str(STATE / "node_modules" / ".bin" / "configurable-http-proxy"))
c.ConfigurableHTTPProxy.command = [proxy]

# ---- each learner's server ----
c.Spawner.cmd = [os.path.join(BIN, "hwlab"), "hub", "singleuser", "--dir", os.path.join(KIT, "notebooks")]
c.Spawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
c.Spawner.environment = {"HWLAB_KIT": KIT, **({"HWLAB_CLASS_DIR": CLASS_DIR} if CLASS_DIR else {})}
# a first spawn copies the notebooks and imports the kit: allow for a busy node
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

# ---- the grading service: runs as the class's account, learners' servers may call it ----
if GRADEBOOK:
    c.JupyterHub.services = [{
        "name": SERVICE, "url": f"http://127.0.0.1:{GRADER_PORT}", "user": CLASS_USER,
        "command": [os.path.join(BIN, "hwlab"), "class", "serve", GRADEBOOK, "--group", INSTRUCTORS],
        "environment": {"PATH": BIN + ":/usr/bin:/bin"}, "cwd": "/"}]
    # the learner's server token may call the service, and nothing more than the hub's default
    c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                     f"access:services!service={SERVICE}"]
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", f"access:services!service={SERVICE}"]}]
    grader_url = os.environ.get("HWLAB_GRADER_URL", f"http://127.0.0.1:{GRADER_PORT}/services/{SERVICE}/")
    c.Spawner.environment["HWLAB_GRADER_URL"] = grader_url
