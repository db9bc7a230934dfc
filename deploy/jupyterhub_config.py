"""JupyterHub configuration for a class on the hwlab kit (JupyterHub 5/6, local users).

Load it as it is (``jupyterhub -f deploy/jupyterhub_config.py``); the Slurm and Kubernetes files
beside it load this one first and change only the spawner. Spawning, login and proxying are the
hub's: this file only says what a learner's server runs. Settings (environment of the hub):

  HWLAB_KIT         the kit's checkout (holds notebooks/); default: the folder above deploy/
  HWLAB_BIN         the bin/ of the venv the kit is installed in (``pip install 'hwlab[lab,hub]'``,
                    with ``python -m ipykernel install --sys-prefix --name hwlab``); readable and
                    runnable by every learner; default: the hub's own venv
  HWLAB_CLASS_DIR   the class drop box (``hwlab class init DIR --group INSTRUCTORS``); unset: no
                    class record
  HWLAB_HUB_PROXY   the configurable-http-proxy command (npm); default: found on PATH
  HWLAB_HUB_AUTH    the authenticator class; default: JupyterHub's PAM (the machine's logins)

Each learner's server is ``hwlab hub singleuser`` (``src/hwlab/cli/cmd_hub.py``): the learner's
own working copy of the notebooks, made on the first spawn and never overwritten, the ``hwlab``
kernel as the default, the learner entered on the class roster, then ``jupyterhub-singleuser``
on that copy, opening notebook 00.
"""
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

KIT = os.environ.get("HWLAB_KIT") or str(Path(__file__).resolve().parents[1])
BIN = os.environ.get("HWLAB_BIN") or os.path.dirname(sys.executable)
CLASS_DIR = os.environ.get("HWLAB_CLASS_DIR")

c.Spawner.cmd = [os.path.join(BIN, "hwlab"), "hub", "singleuser", "--dir", os.path.join(KIT, "notebooks")]
c.Spawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
c.Spawner.environment = {"HWLAB_KIT": KIT, **({"HWLAB_CLASS_DIR": CLASS_DIR} if CLASS_DIR else {})}
# a first spawn copies the notebooks and imports the kit: allow for a busy node
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.authenticator_class = os.environ.get("HWLAB_HUB_AUTH", "pam")
if os.environ.get("HWLAB_HUB_PROXY"):
    c.ConfigurableHTTPProxy.command = [os.environ["HWLAB_HUB_PROXY"]]
