"""JupyterHub on a Slurm cluster (batchspawner's SlurmSpawner): one GPU or one MIG slice per learner.

``jupyterhub -f deploy/jupyterhub_config_slurm.py``. Loads ``jupyterhub_config.py`` beside it (the
learner's server, the kit, the class drop box), then asks Slurm for each learner's server. Settings
(environment of the hub), each passed to batchspawner's own option of the same meaning:

  HWLAB_SLURM_PARTITION  partition                          (req_partition; default "gpu")
  HWLAB_SLURM_TIME       time limit per server, HH:MM:SS     (req_runtime; default "02:00:00")
  HWLAB_SLURM_GPU        the GPU per learner, a Slurm GRES:  "gpu:1" (a whole GPU, the default) or a
                         MIG slice as the cluster's gres.conf names it, e.g. "gpu:1g.18gb:1"
  HWLAB_SLURM_MEMORY     host memory per server              (req_memory; default "16G")
  HWLAB_SLURM_CPUS       CPU cores per server                (req_nprocs; default "4")

The kit and its venv (HWLAB_KIT, HWLAB_BIN) must be at the same path on every compute node; the job
runs ``HWLAB_BIN/batchspawner-singleuser`` by its full path (the job's environment has no PATH to
find it by). HWLAB_GRADER_URL must name the grading service at an address the compute nodes reach
(e.g. ``http://HUB-HOST:10101/services/hwlab-grader/``), and the service listen there
(HWLAB_GRADER_PORT; the hub's host firewall open to the nodes only).
"""
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821
load_subconfig(str(Path(__file__).with_name("jupyterhub_config.py")))  # noqa: F821

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
# JupyterHub 6 passes the job no PATH: the job runs the venv's own batchspawner-singleuser by its path
c.SlurmSpawner.batchspawner_singleuser_cmd = os.path.join(
    os.environ.get("HWLAB_BIN") or os.path.dirname(sys.executable), "batchspawner-singleuser")
# the servers run on compute nodes: the hub listens where they reach it
c.JupyterHub.hub_ip = os.environ.get("HWLAB_HUB_IP", "0.0.0.0")
c.SlurmSpawner.req_partition = os.environ.get("HWLAB_SLURM_PARTITION", "gpu")
c.SlurmSpawner.req_runtime = os.environ.get("HWLAB_SLURM_TIME", "02:00:00")
c.SlurmSpawner.req_memory = os.environ.get("HWLAB_SLURM_MEMORY", "16G")
c.SlurmSpawner.req_nprocs = os.environ.get("HWLAB_SLURM_CPUS", "4")
c.SlurmSpawner.req_gres = os.environ.get("HWLAB_SLURM_GPU", "gpu:1")
# queueing for a GPU can take a while; the spawn form says so instead of failing
c.SlurmSpawner.start_timeout = 600
