"""A hand-written Triton matmul with a tile far too large for its warps: a 256 x 256 fp32
accumulator over 4 warps (128 threads) needs 512 registers per thread for the accumulator
alone, and a thread has at most 255, so the compiler spills to local memory."""
import torch
import triton
import triton.language as tl

#: the tile and warps this example launches with (the test checks the register arithmetic)
TILE_M, TILE_N, TILE_K, NUM_WARPS = 256, 256, 64, 4


@triton.jit
def big_tile_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_spill(a, b):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, TILE_M), triton.cdiv(N, TILE_N))
    big_tile_matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                 c.stride(0), c.stride(1), BLOCK_M=TILE_M, BLOCK_N=TILE_N, BLOCK_K=TILE_K,
                                 num_warps=NUM_WARPS, num_stages=2)
    return c


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 4096 if dev == "cuda" else 256
    dt = torch.bfloat16 if dev == "cuda" else torch.float16  # Triton's CPU interpreter gets bf16 wrong
    return torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
