"""JupyterHub on Kubernetes (KubeSpawner): one GPU or one MIG slice per learner's pod.

Two ways to use it: as ``hub.extraConfig`` of zero-to-jupyterhub (``values.yaml`` beside it sets
the same from the chart's own keys, and this file is what a hub without the chart loads), or
``jupyterhub -f deploy/kubernetes/jupyterhub_config_k8s.py`` for a hub of your own. It loads
``../jupyterhub_config.py`` where it is present (a plain hub; the chart's hub image has its own), then
sets the pod. Settings (environment of the hub):

  HWLAB_IMAGE         the learner's image: the kit installed (``pip install 'hwlab[lab,hub]'``, the
                      ``hwlab`` kernel), its checkout at HWLAB_KIT (default /opt/hwlab)
  HWLAB_GPU_RESOURCE  the extended resource per pod: ``nvidia.com/gpu`` (a whole GPU, the default) or
                      a MIG slice as NVIDIA's device plugin names it under its "mixed" strategy, e.g.
                      ``nvidia.com/mig-1g.18gb``
  HWLAB_MEM_LIMIT     memory limit per pod (default "16G"); HWLAB_CPU_LIMIT cores (default 4)
  HWLAB_HUB_AUTH      the authenticator (default "github": oauthenticator's GitHubOAuthenticator, its
                      client id, secret, callback and allowed organisations set as in values.yaml);
                      never the dummy one. The machine's PAM logins of the local hub do not apply
                      in a pod, and the grading service of the local hub is not started here.
"""
import os
from pathlib import Path

c = get_config()  # noqa: F821
base = Path(__file__).resolve().parents[1] / "jupyterhub_config.py"
if base.is_file():
    load_subconfig(str(base))  # noqa: F821

KIT = os.environ.get("HWLAB_KIT", "/opt/hwlab")
GPU = os.environ.get("HWLAB_GPU_RESOURCE", "nvidia.com/gpu")
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.JupyterHub.authenticator_class = os.environ.get("HWLAB_HUB_AUTH", "github")
if c.JupyterHub.authenticator_class in ("dummy", "null", "jupyterhub.auth.DummyAuthenticator"):
    raise ValueError("HWLAB_HUB_AUTH names the dummy authenticator: anyone would log in as anyone")
c.Authenticator.allowed_groups = set()  # the local hub's system groups mean nothing in a pod
c.JupyterHub.services = []
c.KubeSpawner.image = os.environ.get("HWLAB_IMAGE", "hwlab:latest")
c.KubeSpawner.cmd = ["hwlab", "hub", "singleuser", "--dir", f"{KIT}/notebooks"]
c.KubeSpawner.environment = {"HWLAB_KIT": KIT,  # no HWLAB_GRADER_URL: no grading service here
                             **({"HWLAB_CLASS_DIR": os.environ["HWLAB_CLASS_DIR"]}
                                if os.environ.get("HWLAB_CLASS_DIR") else {})}
c.KubeSpawner.extra_resource_limits = {GPU: "1"}
c.KubeSpawner.extra_resource_guarantees = {GPU: "1"}
c.KubeSpawner.mem_limit = os.environ.get("HWLAB_MEM_LIMIT", "16G")
c.KubeSpawner.cpu_limit = float(os.environ.get("HWLAB_CPU_LIMIT", "4"))
c.KubeSpawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
c.KubeSpawner.start_timeout = 600  # a GPU node may be scaled up first
