"""Lab 4's kernels compiled for sm_90a without a GPU: registers, spills, shared memory.

    TRITON_INTERPRET=0 python benchmarks/lab04_static_registers.py OUT.json

The static evidence behind the tuning rounds in LAB04_NOTES.md (a CPU result: ptxas of this
machine's Triton, not the H200's, so counts can differ by a few registers): the old FP8
attention tile (128 positions x 128 dims, 4 warps) against the tuned one (32, 1 warp) and the
tensor-core variant (:mod:`hwlab.labs.fp8.research`); W8A16 tiles at two pipeline depths (the shared memory does not grow with
``num_stages``: the loads are not pipelined); the kit's decode GEMM (:mod:`hwlab.labs.fp8.decode_gemm`,
round 7) with and without a mask along K: with it the loads are single bytes, Triton keeps one
stage in shared memory and holds the tiles in registers; without it (K a multiple of the tile)
the pipeline holds every stage.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compile real kernels (no GPU needed for sm_90a)

import triton  # noqa: E402

from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import decode_gemm as G  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.labs.registers import ptxas_sm90  # noqa: E402

ATTN_SIG = {"q_ptr": "*bf16", "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "kv_scale_ptr": "*fp32", "m_ptr": "*fp32",
            "l_ptr": "*fp32", "acc_ptr": "*fp32", "n_ctx": "i32", "nctx_ptr": "*i32", "max_ctx": "i32",
            "n_splits": "i32", "sm_scale": "fp32", "H": "i32", "stride_qb": "i32", "stride_qh": "i32",
            "D": "constexpr", "CHUNK": "constexpr", "BLOCK_T": "constexpr", "PER_ROW": "constexpr"}
#: the research kernel's signature: round 2's lab kernel's plus the two variant switches
VARIANT_SIG = {**ATTN_SIG, "USE_DOT": "constexpr", "PREFETCH": "constexpr"}
#: the lab kernel's switches for what the register report leaves off: PDL and the fused KV write (round 6)
LAB_OFF = {"PDL": False, "kn_ptr": None, "vn_ptr": None, "stride_kb": 0, "stride_kh": 0, "stride_vb": 0,
           "stride_vh": 0, "NEW_KV": False}
#: round 8's fused combine (research's ``_decode_attn_partial_r8``): off, and on with the per-row
#: counters, the output (FP8, the next GEMM's input) and its scale
FUSED_OFF = {"cnt_ptr": None, "out_ptr": None, "os_ptr": None, "COMBINE": False, "SPLITS": 2, "QUANT": False,
             "FENCE": False}
FUSED_ON = {"COMBINE": True, "SPLITS": 16, "QUANT": True, "FENCE": True}
FUSED_SIG = {"cnt_ptr": "*i32", "out_ptr": "*fp8e4nv", "os_ptr": "*fp32"}
#: the lab kernel since round 3: the scale folded into q (qk_scale), fp16 math for an FP8 cache
LAB_SIG = {**{("qk_scale" if k == "sm_scale" else k): v for k, v in ATTN_SIG.items()}, "F16": "constexpr",
           "PDL": "constexpr", **{k: "constexpr" for k in LAB_OFF}}
R8_SIG = {**LAB_SIG, **{k: "constexpr" for k in FUSED_OFF}}


def launched_attrs(sig: dict) -> dict:
    """What Triton's launcher specialises a call on, as a static compile's ``attrs``: every pointer
    and every int32 stride 16-byte aligned (the lab's tensors are; an unaligned compile reads them
    a byte at a time)."""
    return {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
            if sig[k].startswith("*") or (k.startswith("stride") and sig[k] == "i32")}

def attn_compile_args(loop: str, block_t: int, loop_stages: int = 0, new_kv: bool = False, fp8: bool = True,
                      chunk: int = 256, d: int = 128):
    """``(kernel, signature, constexprs)`` of the FP8 decode attention's partial kernel for a static
    compile: ``loop`` "lab" (the lab's kernel) or research's round-10 "lean" / "rows" loops
    (:func:`~hwlab.labs.fp8.research.decode_attention_lean`), on an FP8 (``fp8``) or bf16 cache;
    ``new_kv``: the new position written first, as the decode step's kernel does."""
    from hwlab.labs.fp8 import attention as A
    from hwlab.labs.fp8 import research as R
    fn = A._decode_attn_partial if loop == "lab" else R._decode_attn_partial_lean
    sig = dict(LAB_SIG)
    c = {"D": d, "CHUNK": chunk, "BLOCK_T": block_t, "PER_ROW": False, "F16": fp8, **LAB_OFF}
    if new_kv:
        sig.update(kn_ptr="*bf16", vn_ptr="*bf16", stride_kb="i32", stride_kh="i32", stride_vb="i32", stride_vh="i32")
        c.update(NEW_KV=True)
    if loop != "lab":
        sig.update(PREFETCH="constexpr", LOOP_STAGES="constexpr", ROWS="constexpr", FINAL="constexpr",
                   out_s_ptr="constexpr", QUANT="constexpr")
        c.update(PREFETCH=0, LOOP_STAGES=loop_stages, ROWS=loop == "rows", FINAL=False, out_s_ptr=None, QUANT=False)
    sig = dict(sig, k_ptr="*fp8e4nv" if fp8 else "*bf16", v_ptr="*fp8e4nv" if fp8 else "*bf16")
    return fn, sig, {k: v for k, v in c.items() if sig[k] == "constexpr"}


def write_static_rows(out_path: str, rows: list, where: str = "") -> None:
    """``rows`` of a static compile (nothing launched) as JSON at ``out_path``, with the Triton
    that compiled them; ``where``: said after "sm_90a" in the source line (" on a CPU")."""
    with open(out_path, "w") as f:
        f.write(json.dumps({"source": f"static compile for sm_90a{where}, nothing launched (triton "
                                      f"{triton.__version__})", "triton": triton.__version__, "rows": rows}, indent=1))


W8_SIG = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "y_ptr": "*bf16", "ws_ptr": "*fp32",
          "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
          "stride_ym": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "SWAP": "constexpr",
          "SPLIT_K": "constexpr", "PREFETCH": "constexpr"}

MM_SIG = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "y_ptr": "*bf16",
          "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
          "stride_wn": "i32", "stride_ym": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
          "STAGES": "constexpr", "SWAP": "constexpr", "SPLIT_K": "constexpr", "PREFETCH_K": "constexpr",
          "EVEN_K": "constexpr", "ACC_K": "constexpr", "FENCE": "constexpr", "PDL": "constexpr",
          "SERIAL_K": "constexpr", "os_ptr": "constexpr", "GELU_Q": "constexpr"}


def main(out_path: str) -> None:
    rows = []
    t = A.DEFAULT_TILE  # "tuned tile": the one the lab runs
    # (label, block_t, warps, kernel): "research" is round 2's elementwise kernel (fp32 math), kept in
    # research.py with its tensor-core switch; "lab" is the lab's kernel (fp16 math on FP8, round 3)
    for label, bt, warps, which, dot, per_row in (
            ("old tile", 128, 4, "research", False, False),
            ("round-2 tile, round-2 kernel", 32, 1, "research", False, False),
            ("tuned tile", t.block_t, t.num_warps, "lab", False, False),
            ("tensor cores", 32, 2, "research", True, False),
            ("tuned tile, per-row lengths (serving stream)", t.block_t, t.num_warps, "lab", False, True)):
        c = {"D": 128, "CHUNK": t.chunk, "BLOCK_T": bt, "PER_ROW": per_row}
        if which == "research":
            c = {**c, "USE_DOT": dot, "PREFETCH": False}
            kernel, sig = R._decode_attn_partial_variants, VARIANT_SIG
        else:
            c = {**c, "F16": True, **LAB_OFF}
            kernel, sig = A._decode_attn_partial, LAB_SIG
        g = ptxas_sm90(kernel, sig, c, {}, {"num_warps": warps, "num_stages": t.num_stages}, label)
        rows.append({"kernel": "_decode_attn_partial (FP8 cache)", "label": label, "warps": warps, **c, **g})
    # the same kernel as Triton's launcher compiles it at run time (16-byte aligned pointers and
    # strides, the cache's D a multiple of 16): 16-byte loads, and far fewer registers than the
    # rows above, which compile it without those facts (round 8); and with round 8's fused combine
    for label, kernel, base, extra in (
            ("tuned tile, as launched (aligned pointers)", A._decode_attn_partial, LAB_SIG, {}),
            ("tuned tile, fused combine, as launched", R._decode_attn_partial_r8, R8_SIG, {**FUSED_OFF, **FUSED_ON})):
        sig = {**base, **(FUSED_SIG if extra else {})}
        c = {k: v for k, v in {"D": 128, "CHUNK": t.chunk, "BLOCK_T": t.block_t, "PER_ROW": False, "F16": True,
                               **LAB_OFF, **extra}.items() if sig[k] == "constexpr"}
        attrs = launched_attrs(sig)
        g = ptxas_sm90(kernel, sig, c, attrs, {"num_warps": t.num_warps, "num_stages": t.num_stages}, label)
        rows.append({"kernel": "_decode_attn_partial (FP8 cache)", "label": label, "warps": t.num_warps,
                     **{k: v for k, v in c.items() if not k.endswith("_ptr")}, **g})
    for label, bn, bk, warps, sk, stages in (("old autotuned tile", 16, 512, 4, 1, 3),
                                             ("old autotuned tile", 16, 512, 4, 1, 5),
                                             ("tuned tile", 64, 256, 8, 4, 3)):
        c = {"BM": 16, "BN": bn, "BK": bk, "SWAP": False, "SPLIT_K": sk, "PREFETCH": False}
        g = ptxas_sm90(R._fp8w_gemm_kernel, W8_SIG, c, {}, {"num_warps": warps, "num_stages": stages}, label)
        rows.append({"kernel": "_fp8w_gemm_kernel", "label": label, "warps": warps, "stages": stages, **c, **g})
    # what Triton's launcher specialises at run time: 16-aligned pointers, strides divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(MM_SIG.items())
             if (k.endswith("_ptr") or k.startswith("stride")) and t != "constexpr"}
    for even_k, stages in ((False, 4), (True, 4), (True, 6)):
        c = {**{k: v for k, v in G.DEFAULT_CONFIG.items() if k not in ("num_warps", "STAGES")}, "BM": 16,
             "STAGES": stages, "EVEN_K": even_k, "ACC_K": G.ACC_K, "FENCE": True, "PDL": False,
             "os_ptr": None, "GELU_Q": False}
        label = f"{'no K mask' if even_k else 'K masked'}, {stages} stages"
        g = ptxas_sm90(G._fp8_decode_gemm_kernel, MM_SIG, c, attrs, {"num_warps": G.DEFAULT_CONFIG["num_warps"]}, label)
        rows.append({"kernel": "_fp8_decode_gemm_kernel", "label": label, "warps": G.DEFAULT_CONFIG["num_warps"], **c, **g})
    for r in rows:
        print(f"{r['kernel']:>34} {r['label']:>20}: {r['regs']} registers, {r['st']} B spill stores, "
              f"{r['shared']} B shared")
    out = {"source": f"static compile for sm_90a on a CPU (triton {triton.__version__}, ptxas -v); not a GPU run",
           "rows": rows}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: TRITON_INTERPRET=0 python benchmarks/lab04_static_registers.py OUT.json")
    main(sys.argv[1])
