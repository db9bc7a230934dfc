"""What the compiler gave a kernel (registers, spills, shared memory) and the guard that gets it
without hanging.

Two sources, one report (:class:`CompileReport`):

* on a GPU, the compiled kernel a Triton launch returns: ``n_regs``, ``n_spills``,
  ``metadata.shared`` (:func:`runtime_report`);
* on any machine, a compile for sm_90a without a GPU and ``ptxas -v`` from the ptxas bundled
  with Triton (:func:`static_report`, :func:`ptxas_sm90`).

Every compile of the lab goes through :func:`compile_guarded`: a child process
(``python -m hwlab.labs.registers --compile ...``) under a time limit, because a spilling tile
can take minutes to compile; a config past the limit is reported as skipped, never hung on.
:func:`compile_guarded_many` runs several such children at once (each compile is one CPU core's
work and nothing is timed while they run), so a sweep waits for its slowest compile, not their sum.
A static report depends only on the kernel, the config and the toolchain, so one process keeps
each it has made and does not compile the same config for sm_90a twice.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hwlab.labs.registers.occupancy import HOPPER, Occupancy, occupancy
from hwlab.labs.registers.kernels import KERNELS, matmul, matmul_softmax_fused
from hwlab.labs.registers.tiles import TileConfig

import triton  # noqa: E402  (after the kernels module, which sets the interpreter up first)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

#: default per-config compile limit (s): a spilling tile compiles for far longer than a fitting
#: one, so the limit is generous; a config past it is reported as skipped
COMPILE_TIMEOUT_S = 120.0


@dataclass
class CompileReport:
    """Resources of one compiled kernel. ``n_spills`` counts 4-byte local-memory slots, as
    Triton's ``kernel.n_spills`` does (static: ptxas stack frame / 4); ``shared_bytes`` per
    block; ``compile_s`` wall seconds of the compile."""

    kernel: str
    config: str
    n_regs: int | None = None
    n_spills: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    shared_bytes: int | None = None
    compile_s: float | None = None
    source: str = ""  # "runtime (GPU)" | "static compile for sm_90a, ptxas -v" | "skipped"
    skipped: str | None = None

    def occupancy(self, warps: int) -> Occupancy | None:
        if self.n_regs is None or self.shared_bytes is None:
            return None
        return occupancy(self.n_regs, self.shared_bytes, warps, HOPPER)

    def to_dict(self) -> dict:
        return asdict(self)


def runtime_report(kernel_name: str, cfg_label: str, compiled) -> CompileReport:
    """Read registers/spills/shared memory off the object a Triton launch returns (GPU)."""
    return CompileReport(kernel_name, cfg_label, n_regs=int(compiled.n_regs),
                         n_spills=int(compiled.n_spills),
                         shared_bytes=int(compiled.metadata.shared), source="runtime (GPU)")


_PTXAS_RE = {
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "st": re.compile(r"(\d+) bytes spill stores"),
    "ld": re.compile(r"(\d+) bytes spill loads"),
    "regs": re.compile(r"Used (\d+) registers"),
}


def _bundled_tool(name: str) -> str:
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not p.exists():
        raise FileNotFoundError(f"triton {triton.__version__} ships no {name} at {p}")
    return str(p)


def _signature(kernel_name: str, dtype: str):
    ptr = f"*{dtype}"
    if kernel_name == "wide_block":
        return ({"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
    sig = {"a_ptr": ptr, "b_ptr": ptr, "c_ptr": ptr, "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32",
           "stride_bn": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr",
           "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    # what Triton's launcher specialises at run time: 16-aligned pointers/sizes, unit strides
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 8, 10)}
    return sig, attrs


def ptxas_sm90(fn, sig: dict, consts: dict, attrs: dict, opts: dict, label: str = "") -> dict:
    """Compile a Triton kernel for sm_90a without a GPU and read ``ptxas -v``: registers,
    stack frame and spill bytes, shared memory (bytes per block), compile seconds. Needs
    ``TRITON_INTERPRET`` off (real, not interpreted, kernels)."""
    t0 = time.time()
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    compile_s = time.time() - t0
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        r = subprocess.run([_bundled_tool("ptxas"), "-v", "--gpu-name", "sm_90a", "-o",
                            str(Path(d) / "k.cubin"), str(ptx)], capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed on {label}: {log[-500:]}")
    g = {k_: int(m.group(1)) if (m := rx.search(log)) else 0 for k_, rx in _PTXAS_RE.items()}
    return {**g, "shared": int(k.metadata.shared), "compile_s": compile_s}


def sass_sm90(fn, sig: dict, consts: dict, attrs: dict, opts: dict) -> str:
    """The SASS (machine code) of a Triton kernel compiled for sm_90a without a GPU, as
    ``nvdisasm`` (bundled with Triton) prints it. Needs ``TRITON_INTERPRET`` off."""
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        r = subprocess.run([_bundled_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {r.stderr[-500:]}")
    return r.stdout


_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
_SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")


def loop_instruction_mix(sass: str) -> dict[str, int]:
    """Opcodes (without their modifiers) counted over the body of the longest loop in ``sass``:
    the instructions between a label and the backward branch to it. What one iteration of a
    kernel's main loop issues per warp; {} when the code has no backward branch."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _SASS_LABEL.match(line.strip()))}
    best: list[str] = []
    for j, line in enumerate(lines):
        m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)\)?", line)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            body = [op.group(1) for op in map(_SASS_OP.search, lines[labels[m.group(1)]:j + 1]) if op]
            if len(body) > len(best):
                best = body
    mix: dict[str, int] = {}
    for op in best:
        mix[op] = mix.get(op, 0) + 1
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]))


def static_report(kernel_name: str, cfg: TileConfig | None = None, dtype: str = "bf16",
                  block: int | None = None, warps: int | None = None) -> CompileReport:
    """Compile for sm_90a without a GPU and read ``ptxas -v`` (in this process; see
    :func:`compile_guarded` for the time-limited version)."""
    fn = KERNELS[kernel_name]
    sig, attrs = _signature(kernel_name, dtype)
    if kernel_name == "wide_block":
        consts = {"BLOCK": block}
        opts = {"num_warps": warps or 1, "num_stages": 1}
        label = f"BLOCK={block} w{warps or 1}"
    else:
        consts = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "stride_ak": 1, "stride_bn": 1,
                  "stride_cn": 1}
        opts = {"num_warps": cfg.warps, "num_stages": cfg.stages}
        label = cfg.label
    g = ptxas_sm90(fn, sig, consts, attrs, opts, label)
    return CompileReport(kernel_name, label, n_regs=g["regs"], n_spills=g["stack"] // 4,
                         spill_store_bytes=g["st"], spill_load_bytes=g["ld"],
                         shared_bytes=g["shared"], compile_s=g["compile_s"],
                         source="static compile for sm_90a, ptxas -v")


def gpu_report(kernel_name: str, cfg: TileConfig) -> CompileReport:
    """Compile ``cfg`` for this GPU by launching it once at a small size (256 rows, K = 256);
    the compiled kernel lands in Triton's on-disk cache, so a later launch of the same config
    at any 16-aligned size loads it instead of compiling again."""
    dev = torch.device("cuda")
    t0 = time.time()
    x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    if kernel_name == "matmul":
        _, k = matmul(x, x, cfg)
    elif kernel_name == "matmul_softmax":
        _, k = matmul_softmax_fused(x, torch.randn(256, cfg.bn, device=dev, dtype=torch.bfloat16),
                                    cfg.bm, cfg.bk, cfg.warps, cfg.stages)
    else:
        raise ValueError(f"{kernel_name} is compiled statically only")
    rep = runtime_report(kernel_name, cfg.label, k)
    rep.compile_s = time.time() - t0
    return rep


def compile_guarded(kernel_name: str, cfg: TileConfig | None = None, *, dtype: str = "bf16",
                    block: int | None = None, warps: int | None = None,
                    timeout_s: float = COMPILE_TIMEOUT_S, static: bool = True) -> CompileReport:
    """Compile in a child process with a time limit (``timeout_s``, seconds); a config past it
    is reported, not hung on.

    ``static=True``: the child compiles for sm_90a and returns the ptxas report (CPU or GPU
    machine). ``static=False`` (GPU): the child compiles for this GPU (:func:`gpu_report`),
    filling Triton's on-disk cache so that the parent's launch of the same config then loads
    instantly. A static report this process already made is returned at once (a copy).
    """
    label = cfg.label if cfg else f"BLOCK={block} w{warps or 1}"
    key = (kernel_name, cfg, dtype, block, warps)
    if static and key in _STATIC_REPORTS:
        return CompileReport(**asdict(_STATIC_REPORTS[key]))
    args = [sys.executable, "-m", "hwlab.labs.registers", "--compile", kernel_name,
            "--dtype", dtype, "--mode", "static" if static else "gpu"]
    args += ["--config", cfg.cli_arg] if cfg else ["--block", str(block), "--warps", str(warps or 1)]
    t0 = time.time()
    try:
        # the child must build real (not interpreted) kernels to compile them for sm_90a
        env = dict(os.environ, **({"TRITON_INTERPRET": "0"} if static else {}))
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return CompileReport(kernel_name, label, compile_s=time.time() - t0,
                             source="skipped", skipped=f"compile exceeded {timeout_s:.0f} s")
    if r.returncode != 0:
        return CompileReport(kernel_name, label, source="skipped",
                             skipped=f"compile failed: {r.stderr.strip().splitlines()[-1:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    rep = CompileReport(**d)
    if static:
        _STATIC_REPORTS[key] = CompileReport(**d)
    return rep


#: static reports this process has made, by (kernel, config, dtype, block, warps)
_STATIC_REPORTS: dict[tuple, CompileReport] = {}


def compile_guarded_many(jobs, *, timeout_s: float = COMPILE_TIMEOUT_S, static: bool = True,
                         max_workers: int | None = None) -> list[CompileReport]:
    """:func:`compile_guarded` for every ``(kernel_name, config)`` in ``jobs`` at once, one child
    each (at most ``max_workers``, default the CPU count), reports in the order given. Each
    keeps its own ``timeout_s``; a config past it is skipped as with one."""
    jobs = list(jobs)
    workers = max(1, min(len(jobs), max_workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda j: compile_guarded(j[0], j[1], timeout_s=timeout_s, static=static), jobs))
