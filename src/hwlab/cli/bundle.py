"""``hwlab bundle OUT.tar.gz``: one archive with what a GPU performance bug report needs.

Maintainers of training and serving stacks ask for the same evidence every time; the archive
holds it, each part as a file, and ``MANIFEST.json`` says for every part whether it is
included, only listed (too large: name and size), or missing, and how to get what is missing:

* ``versions.json``: Python, torch, CUDA runtime, triton, NCCL, driver (:func:`hwlab.core.system.versions`
  and NVML);
* ``nvml.json``: the NVML snapshot (clocks, temperature, throttle reasons, PCIe, ECC) or why
  NVML is absent;
* ``topo.txt``: ``nvidia-smi topo -m``, or why it is absent;
* ``nccl.json``: the NCCL version and every ``NCCL_*`` setting in the environment;
* ``env.json``: the environment filtered to names starting with :data:`ENV_PREFIXES`; a name
  that also looks like a credential (:data:`SECRET_WORDS`) keeps its name, not its value. No
  other variable is ever written.
* ``doctor.json``: ``hwlab doctor --quick`` (skipped with ``--no-doctor``);
* with ``--run-dir``: the startup capture (``*/rank-*.json``, ``*/node.json``, ``mapping.json``),
  NCCL logs (``*/nccl.*.log``), step logs and profiler traces: each file included when under
  :data:`SMALL_FILE_BYTES` and the run's included total under :data:`RUN_BYTES_CAP`, else listed
  with its size; and the ``hwlab ranks`` report (text and JSON) of the run.

The destination is checked before anything is gathered (a folder, an existing file without
``--force``, an unwritable folder: refused), and the archive is written to a temporary name in
the same folder and linked into place, so a reader never sees half an archive and an existing
file is never replaced silently. If the write still fails (the disk fills, a size limit), the
archive goes to the rescue folder (:func:`hwlab.core.store.rescue`) and the manifest's ``rescued``
says where, in one line.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from hwlab.core import system
from hwlab.errors import UserInputError
from hwlab.core.store import DestinationError, check_destination, dumps_strict, publish, rescue, temp_beside

ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "HWLAB_")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE")
SMALL_FILE_BYTES = 8 << 20   # a trace or log under 8 MB goes in whole
RUN_BYTES_CAP = 64 << 20     # and the run's files in the archive stay under 64 MB together
NCCL_HOWTO = ("re-run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH "
              "NCCL_DEBUG_FILE=RUN_DIR/%h/nccl.%p.log (or hwlab.core.capture.capture(run_dir, nccl_log=True))")


def filtered_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment, names starting with :data:`ENV_PREFIXES` only; credential-like values
    replaced by ``"<redacted>"``."""
    env = dict(os.environ if env is None else env)
    out = {}
    for k in sorted(env):
        if k.startswith(ENV_PREFIXES):
            out[k] = "<redacted>" if any(w in k.upper() for w in SECRET_WORDS) else env[k]
    return out


def _topo_text() -> tuple[str | None, str | None]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found on PATH (no NVIDIA driver here)"
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi topo -m failed: {e}"
    if r.returncode != 0:
        return None, f"nvidia-smi topo -m exited {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}"
    return r.stdout, None


def _run_files(run_dir: Path) -> list[tuple[str, Path]]:
    """(kind, path) of the run's files worth sending. A trace is a file named like one (sent even
    when it is truncated: that is often the bug) or a ``.json`` / ``.json.gz`` whose content starts
    like one, whatever its name (``control.json.gz``: :func:`hwlab.traces.kineto.sniff`)."""
    from hwlab.traces.kineto import TRACE_SUFFIXES, is_trace_name, sniff
    pats = [("capture", "*/rank-*.json"), ("capture", "*/node.json"), ("capture", "mapping.json"),
            ("nccl log", "*/nccl.*.log"), ("nccl log", "nccl*.log"), ("step log", "*/steps-rank-*.jsonl")]
    seen, out = set(), []
    for kind, pat in pats:
        for p in sorted(run_dir.glob(pat)):
            if p.is_file() and p not in seen:
                seen.add(p)
                out.append((kind, p))
    for p in sorted(run_dir.rglob("*")):
        if p.is_file() and p not in seen and (is_trace_name(p) or (p.name.endswith(TRACE_SUFFIXES)
                                                                     and sniff(p) is None)):
            seen.add(p)
            out.append(("trace", p))
    return out


def build(out: str | os.PathLike, *, run_dir: str | os.PathLike | None = None, doctor: bool = True,
          force: bool = False, env: dict[str, str] | None = None, pynvml: Any | None = None,
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write the archive (module docstring); returns the manifest."""
    out = Path(out)
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserInputError(f"{out}: name the archive *.tar.gz")
    run = Path(run_dir) if run_dir is not None else None
    if run is not None and not run.is_dir():
        raise UserInputError(f"--run-dir {run} is not a folder: pass the run directory your job wrote")
    check_destination(out, overwrite=force)  # before any work
    step = progress or (lambda msg: None)
    files: dict[str, bytes] = {}
    parts: list[dict[str, Any]] = []

    def add(name: str, data: str | bytes, what: str) -> None:
        files[name] = data.encode() if isinstance(data, str) else data
        parts.append({"part": what, "status": "included", "file": name, "n_bytes": len(files[name])})

    def missing(what: str, why: str, how: str) -> None:
        parts.append({"part": what, "status": "missing", "why": why, "how_to_get": how})

    step("versions and NVML")
    snap = system.snapshot(pynvml)
    vers = dict(snap["versions"])
    add("versions.json", dumps_strict(vers, reasons_key=None), "versions (python, torch, CUDA, triton, NCCL, driver)")
    add("nvml.json", dumps_strict(snap, reasons_key=None), "NVML state")
    if not snap["nvml"].get("available"):
        missing("NVML GPU state", snap["nvml"].get("reason", "NVML absent"),
                "run on the GPU node with the NVIDIA driver and `pip install nvidia-ml-py`")
    step("nvidia-smi topo -m")
    topo, why = _topo_text()
    if topo:
        add("topo.txt", topo, "nvidia-smi topo -m")
    else:
        missing("nvidia-smi topo -m", why, "run `nvidia-smi topo -m > topo.txt` on the GPU node and attach it")
    fenv = filtered_env(env)
    nccl_env = {k: v for k, v in fenv.items() if k.startswith("NCCL_")}
    add("nccl.json", dumps_strict({"nccl_version": vers.get("nccl"), "nccl_env": nccl_env}, reasons_key=None),
        "NCCL version and NCCL_* settings")
    add("env.json", dumps_strict({"prefixes": list(ENV_PREFIXES), "env": fenv}, reasons_key=None),
        f"environment ({', '.join(ENV_PREFIXES)} names only)")
    if doctor:
        step("hwlab doctor --quick")
        try:
            from hwlab.diagnosis.doctor import doctor_report
            add("doctor.json", dumps_strict(doctor_report(quick=True), reasons_key=None), "hwlab doctor --quick")
        except Exception as e:  # the bundle still carries the rest
            missing("hwlab doctor", f"{type(e).__name__}: {e}", "run `hwlab doctor --json > doctor.json` and attach it")
    else:
        missing("hwlab doctor", "skipped (--no-doctor)", "run `hwlab doctor --quick --json > doctor.json`")
    if run is not None:
        step("the run's files")
        kinds: dict[str, int] = {}
        total = 0
        listed = []
        for kind, p in _run_files(run):
            kinds[kind] = kinds.get(kind, 0) + 1
            size = p.stat().st_size
            rel = p.relative_to(run).as_posix()
            if size <= SMALL_FILE_BYTES and total + size <= RUN_BYTES_CAP:
                add(f"run/{rel}", p.read_bytes(), f"{kind}: {rel}")
                total += size
            else:
                listed.append({"part": f"{kind}: {rel}", "status": "listed", "n_bytes": size,
                               "why": f"over {SMALL_FILE_BYTES >> 20} MB per file or {RUN_BYTES_CAP >> 20} MB "
                                      "per run", "how_to_get": f"attach {p} separately"})
        parts.extend(listed)
        if not kinds.get("capture"):
            missing("startup capture", f"no */rank-*.json in {run}",
                    "call hwlab.core.capture.capture(run_dir) at startup on every rank")
        if not kinds.get("nccl log"):
            missing("NCCL debug log with topology", f"no nccl.*.log in {run}", NCCL_HOWTO)
        if not (kinds.get("step log") or kinds.get("trace")):
            missing("step logs or traces", f"none in {run}",
                    "record hwlab.core.steplog.StepLog in the loop, or torch.profiler with tensorboard_trace_handler")
        else:
            step("hwlab ranks")
            try:
                from hwlab.diagnosis import ranks, ranks_traces
                mod = ranks_traces if ranks_traces.looks_like_traces(run) else ranks
                rep = mod.report(run)
                add("ranks.json", dumps_strict(rep, reasons_key=None), "hwlab ranks --json")
                add("ranks.txt", mod.render(rep) + "\n", "hwlab ranks")
            except UserInputError as e:
                missing("hwlab ranks report", str(e), "fix what it says and run `hwlab ranks RUN_DIR --json`")
    else:
        missing("the run (startup capture, step logs or traces, NCCL log, hwlab ranks report)",
                "no --run-dir given", "hwlab bundle OUT.tar.gz --run-dir RUN_DIR")
        missing("NCCL debug log with topology", "no --run-dir given", NCCL_HOWTO)
    missing("benchmark command and output, good and bad configuration", "not something the kit can know",
            "add the command line and output of the good and the bad run to the report")
    manifest = {"schema": "hwlab.bundle/1", "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "host": snap.get("host"), "run_dir": str(run) if run else None, "archive": str(out),
                "env_prefixes": list(ENV_PREFIXES), "parts": parts}
    files["MANIFEST.json"] = dumps_strict(manifest, reasons_key=None).encode()
    root = out.name.split(".tar")[0].removesuffix(".tgz")
    try:
        _write_tar(out, files, force, root)
    except OSError as e:  # checked before gathering; a disk that fills or a size limit met while writing
        manifest["rescued"] = rescue(None, "bundle", out, e, suffix=".tar.gz",
                                     write=lambda p: _write_tar(p, files, True, root),
                                     lost="nothing was written: free space or choose another destination, "
                                          "then run hwlab bundle again")
    return manifest


def _write_tar(out: Path, files: dict[str, bytes], force: bool, root: str) -> None:
    with temp_beside(out) as tmp:  # removed on any failure or SIGTERM (core.store)
        with tarfile.open(tmp, "w:gz") as tar:
            now = time.time()
            for name, data in files.items():
                info = tarfile.TarInfo(f"{root}/{name}")
                info.size, info.mtime, info.mode = len(data), now, 0o644
                tar.addfile(info, io.BytesIO(data))
        os.chmod(tmp, 0o644)
        publish(tmp, out, overwrite=force)


__all__ = ["build", "filtered_env", "ENV_PREFIXES", "DestinationError"]
