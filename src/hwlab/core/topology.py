"""The machine's GPU/NIC/CPU topology, from ``nvidia-smi topo -m`` text or from NVML.

Link classes, fastest to slowest (nvidia-smi's legend):

=======  =================================================================  ====
class    path                                                               rank
=======  =================================================================  ====
X        the device itself                                                  0
NV#      a bonded set of # NVLinks (more links, more bandwidth)             1
PIX      at most one PCIe bridge (same switch)                              2
PXB      several PCIe bridges, not through the host bridge                  3
PHB      through a PCIe host bridge (the CPU)                               4
NODE     between host bridges inside one NUMA node                          5
SYS      across the socket interconnect (QPI/UPI/xGMI) between NUMA nodes   6
=======  =================================================================  ====

``SOC`` is the old (pre-2017 driver) name of ``SYS`` and is read as ``SYS``. Within ``NV#``
a larger # sorts faster. A high-traffic collective (the TP all-reduce) that crosses a
class slower than the best available one is the topology fault of the seed's 0.72x case.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

from hwlab.errors import UserInputError
from hwlab.core.system import nvml_session
from hwlab.core.store import read_user_text

LINK_ORDER = ["X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"]
_AFFINITY_HEADERS = [("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID")]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # nvidia-smi underlines the header on a tty
_LINK_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


class TopologyParseError(ValueError):
    """``nvidia-smi topo -m`` text that cannot be read; the message names the line."""


def link_class(cell: str) -> str:
    """Normalise a cell: 'NV12' -> 'NV12', 'SOC' -> 'SYS'."""
    return "SYS" if cell == "SOC" else cell


def link_rank(cell: str) -> tuple[int, int]:
    """Sort key, smaller is faster: (class rank, -#links for NV#)."""
    c = link_class(cell)
    if c.startswith("NV"):
        return (1, -int(c[2:]))
    try:
        return (LINK_ORDER.index(c), 0)
    except ValueError:
        raise ValueError(f"unknown link class {cell!r}; expected one of X, NV#, "
                         "PIX, PXB, PHB, NODE, SYS") from None


def is_nvlink(cell: str) -> bool:
    return link_class(cell).startswith("NV")


@dataclass
class Topology:
    """Pairwise link classes between GPUs (and NICs), with CPU/NUMA affinity per GPU."""

    gpus: list[str]
    nics: list[str] = field(default_factory=list)
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, int | None] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def link(self, a: str | int, b: str | int) -> str:
        a, b = self._name(a), self._name(b)
        return self.links[(a, b)]

    def _name(self, x: str | int) -> str:
        return f"GPU{x}" if isinstance(x, int) else x

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    def gpu_link_classes(self) -> set[str]:
        return {self.links[(a, b)] for a, b in combinations(self.gpus, 2)}

    def slowest_link(self, group: Iterable[str | int]) -> str:
        """The slowest link class between any two GPUs of ``group`` ('X' for one GPU)."""
        names = [self._name(g) for g in group]
        cells = [self.links[(a, b)] for a, b in combinations(names, 2)]
        return max(cells, key=link_rank) if cells else "X"

    def numa_groups(self) -> dict[int | None, list[str]]:
        out: dict[int | None, list[str]] = {}
        for g in self.gpus:
            out.setdefault(self.numa_affinity.get(g), []).append(g)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "nics": self.nics, "source": self.source,
            "links": {f"{a}|{b}": c for (a, b), c in self.links.items()},
            "cpu_affinity": self.cpu_affinity, "numa_affinity": self.numa_affinity,
            "nic_names": self.nic_names,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Topology":
        links = {tuple(k.split("|")): v for k, v in d["links"].items()}
        return cls(gpus=d["gpus"], nics=d.get("nics", []), links=links,  # type: ignore[arg-type]
                   cpu_affinity=d.get("cpu_affinity", {}),
                   numa_affinity=d.get("numa_affinity", {}),
                   nic_names=d.get("nic_names", {}), source=d.get("source", ""))

    def render(self) -> str:
        """The matrix as nvidia-smi prints it (GPU and NIC rows), for notebooks and reports."""
        devs = self.gpus + self.nics
        lines = ["      " + "".join(f"{d:>8}" for d in devs) + "  CPU Affinity  NUMA"]
        for a in devs:
            row = "".join(f"{self.links[(a, b)]:>8}" for b in devs)
            extra = ""
            if a in self.gpus:
                extra = f"  {self.cpu_affinity.get(a, ''):<12}  {self.numa_affinity.get(a)}"
            lines.append(f"{a:<6}{row}{extra}")
        return "\n".join(lines)


def _header_tokens(tokens: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(tokens):
        for words in _AFFINITY_HEADERS:
            if tuple(tokens[i:i + len(words)]) == words:
                out.append(" ".join(words))
                i += len(words)
                break
        else:
            out.append(tokens[i])
            i += 1
    return out


def parse_topo_matrix(text: str, source: str = "") -> Topology:
    """Parse the output of ``nvidia-smi topo -m`` (any driver since the SOC/SYS rename).

    Accepts a shell prompt or other text before the header, tabs or spaces, indented
    tables, optional NIC rows and an optional ``NIC Legend``. Raises
    :class:`TopologyParseError` naming the 1-based line number for anything malformed.
    """
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]
                  and len(ln.split()) > 1 and not _LINK_RE.match(ln.split()[1])), None)
    if start is None:
        raise TopologyParseError("no header line starting with 'GPU0' found: is this the "
                                 "output of `nvidia-smi topo -m`?")
    header = _header_tokens(lines[start].split())
    devs = [h for h in header if not any(h == " ".join(w) for w in _AFFINITY_HEADERS)]
    extra_cols = header[len(devs):]
    if header[:len(devs)] != devs:
        raise TopologyParseError(f"line {start + 1}: affinity columns must come after the devices")
    topo = Topology(gpus=[d for d in devs if d.startswith("GPU")],
                    nics=[d for d in devs if not d.startswith("GPU")], source=source)
    seen_rows: list[str] = []
    i = start + 1
    while i < len(lines):
        ln = lines[i]
        toks = ln.split()
        if not toks:
            i += 1
            if seen_rows and len(seen_rows) >= len(topo.gpus):
                break
            continue
        if toks[0].rstrip(":") in ("Legend", "NIC"):
            break
        name = toks[0]
        if name not in devs:
            raise TopologyParseError(f"line {i + 1}: row {name!r} is not a column of the header "
                                     f"({', '.join(devs)})")
        cells = toks[1:1 + len(devs)]
        if len(cells) < len(devs):
            raise TopologyParseError(f"line {i + 1}: row {name} has {len(cells)} link cells, "
                                     f"expected {len(devs)}")
        for col, cell in zip(devs, cells):
            if not _LINK_RE.match(cell):
                raise TopologyParseError(f"line {i + 1}: row {name}, column {col}: {cell!r} is "
                                         "not a link class (X, NV#, PIX, PXB, PHB, NODE, SYS)")
            if (col == name) != (cell == "X"):
                raise TopologyParseError(f"line {i + 1}: row {name}, column {col}: 'X' must "
                                         "appear exactly on the diagonal")
            topo.links[(name, col)] = link_class(cell)
        rest = toks[1 + len(devs):]
        if name.startswith("GPU") and rest:
            vals = dict(zip(extra_cols, rest))
            if "CPU Affinity" in vals:
                topo.cpu_affinity[name] = vals["CPU Affinity"]
            numa = vals.get("NUMA Affinity")
            topo.numa_affinity[name] = int(numa) if numa and numa.isdigit() else None
        seen_rows.append(name)
        i += 1
    missing = [d for d in devs if d not in seen_rows]
    if missing:
        raise TopologyParseError(f"rows missing for {', '.join(missing)} (table ends at line {i})")
    for a, b in combinations(devs, 2):
        if topo.links[(a, b)] != topo.links[(b, a)]:
            raise TopologyParseError(f"asymmetric table: {a}->{b} is {topo.links[(a, b)]} but "
                                     f"{b}->{a} is {topo.links[(b, a)]}")
    for ln in lines[i:]:
        m = re.match(r"\s*(NIC\d+):\s*(\S+)", ln)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
    return topo


# NVML common-ancestor levels -> link class (nvml.h nvmlGpuTopologyLevel_t)
_NVML_LEVEL = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def from_nvml(pynvml: Any | None = None) -> Topology | None:
    """Build the GPU part of the model from NVML (common ancestor + active NVLink counts).

    Returns ``None`` without NVML. Queries NVML refuses (NVLink/NUMA on a one-GPU VM) leave
    the PCIe class in place and the NUMA node unknown.
    """
    with nvml_session(pynvml) as (nvml, _why):
        if nvml is None:
            return None
        n = nvml.nvmlDeviceGetCount()
        hs = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = []
        for h in hs:
            b = nvml.nvmlDeviceGetPciInfo(h).busId
            bus.append((b.decode() if isinstance(b, bytes) else b).lower())
        gpus = [f"GPU{i}" for i in range(n)]
        topo = Topology(gpus=gpus, source="nvml")
        nv_count = [[0] * n for _ in range(n)]
        for i, h in enumerate(hs):
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if not nvml.nvmlDeviceGetNvLinkState(h, link):
                        continue
                    rb = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                    rb = (rb.decode() if isinstance(rb, bytes) else rb).lower()
                except Exception:
                    break
                for j in range(n):
                    if j != i and rb[-12:] == bus[j][-12:]:
                        nv_count[i][j] += 1
        for i in range(n):
            for j in range(n):
                if i == j:
                    cls = "X"
                elif nv_count[i][j]:
                    cls = f"NV{nv_count[i][j]}"
                else:
                    try:
                        lvl = nvml.nvmlDeviceGetTopologyCommonAncestor(hs[i], hs[j])
                        cls = _NVML_LEVEL.get(int(lvl), "SYS")
                    except Exception:
                        cls = "SYS"
                topo.links[(gpus[i], gpus[j])] = cls
            try:
                topo.numa_affinity[gpus[i]] = int(nvml.nvmlDeviceGetNumaNodeId(hs[i]))
            except Exception:
                topo.numa_affinity[gpus[i]] = None
        return topo


def capture_topo_text(timeout_s: float = 20.0) -> str | None:
    """Run ``nvidia-smi topo -m``; ``None`` where nvidia-smi is absent, fails or hangs past
    ``timeout_s`` seconds (a wedged driver can hang it; the capture then falls back to NVML)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


#: the capture's source when neither nvidia-smi nor NVML answered
ABSENT = "absent"
SMI_SOURCE = "nvidia-smi topo -m"


@dataclass
class TopologyCapture:
    """This machine's topology as the kit captured it: the model (``None`` when nothing
    answered), the raw ``nvidia-smi topo -m`` text (``None`` from NVML or when absent), where
    it came from, and why the nvidia-smi text was not used when it could not be parsed."""

    topo: Topology | None
    text: str | None
    source: str
    error: str | None = None


def capture(topo_file: str | os.PathLike | None = None, *, pynvml: Any | None = None) -> TopologyCapture:
    """The kit's one topology capture with its fallbacks, in order: a saved ``nvidia-smi topo -m``
    file the user passes (``topo_file``; unreadable or unparsable is the user's input error),
    else ``nvidia-smi topo -m`` run now (unparsable text is kept with the error, and NVML is
    asked instead), else NVML (:func:`from_nvml`), else ``source`` starts with :data:`ABSENT`."""
    if topo_file is not None:
        p = Path(topo_file)
        text = read_user_text(p, "topology file", "pass a saved `nvidia-smi topo -m` output")
        try:
            return TopologyCapture(parse_topo_matrix(text, source=f"injected from {p.name}"), text,
                                   f"injected from {p}")
        except TopologyParseError as e:
            raise UserInputError(f"{p}: {e}") from None
    text = capture_topo_text()
    error = None
    if text:
        try:
            return TopologyCapture(parse_topo_matrix(text, source=SMI_SOURCE), text, SMI_SOURCE)
        except TopologyParseError as e:
            error = str(e)
    t = from_nvml(pynvml) if pynvml is not None else from_nvml()
    if t is not None:
        return TopologyCapture(t, text, "nvml", error)
    return TopologyCapture(None, text, f"{ABSENT}: no nvidia-smi and no NVML on this node", error)
