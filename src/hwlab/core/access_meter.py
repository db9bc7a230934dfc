"""Memory traffic of a call, counted where it runs on a CPU: every ``tl.load`` / ``tl.store`` of
a Triton kernel in the interpreter (its addresses and mask), and every torch op outside a
kernel by the tensors it reads and writes.

Two figures, each an estimate from the access pattern (no DRAM is measured on a CPU):

* **Bytes moved** (``dram_bytes``): per kernel launch, each distinct 32-byte sector read once
  and each distinct sector written once (a launch's re-reads are taken to hit in L2); a torch
  op moves the bytes of the tensors it reads plus those it writes (views and allocations
  move nothing). A chain of passes pays each intermediate twice; one fused pass pays the
  inputs and the output once: the fusion figure, against the work's floor.
* **Sector use** (``sector_use``): over every warp request, the bytes asked for over the bytes
  of the 32-byte sectors it touches. 1.0 means every byte of every sector fetched is used
  (coalesced); a request whose lanes stride across rows pulls a whole sector per element (2
  useful bytes of 32 for fp16): the layout figure. It bounds the share of the copy bandwidth
  an access pattern can reach. A program's ``tl.load`` / ``tl.store`` is split into warp
  requests as Triton's coalescing pass lays lanes out: along the pointer block's contiguous
  axis where it has one (16 bytes per lane, 32 lanes), so a 2-D tile is coalesced whichever of
  its axes is contiguous; one element per lane in the block's order where none is.

Only the interpreter exposes loads and stores: on a GPU the meter counts the torch ops alone
and says so (``interpreted`` False); there Nsight Compute's sector counters are the measure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hwlab.core import tritonenv  # noqa: F401  (before triton: the interpreter without a GPU)

#: bytes of one memory sector: the unit DRAM and L2 move
SECTOR_BYTES = 32
#: torch ops that allocate or reshape without moving data
_NO_DATA = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                      "lift_fresh", "detach", "_to_copy_meta", "alias", "set_", "resize_"})


@dataclass
class Launch:
    """One kernel launch's requests: the sectors each side touched, requested and sector bytes."""

    name: str
    read_sectors: list[np.ndarray] = field(default_factory=list)
    write_sectors: list[np.ndarray] = field(default_factory=list)
    requested_bytes: int = 0
    sector_bytes: int = 0
    n_requests: int = 0
    #: requested and sector bytes of the loads and of the stores apart: (requested, sector) each
    by_side: dict[str, list[int]] = field(default_factory=lambda: {"load": [0, 0], "store": [0, 0]})

    def side_use(self, side: str) -> float | None:
        req, sec = self.by_side[side]
        return req / sec if sec else None

    def dram_bytes(self) -> int:
        n = 0
        for parts in (self.read_sectors, self.write_sectors):
            if parts:
                n += int(np.unique(np.concatenate(parts)).size) * SECTOR_BYTES
        return n


@dataclass
class TorchOp:
    name: str
    n_bytes: int


@dataclass
class Traffic:
    """What :func:`meter` counted over one call."""

    launches: list[Launch]
    torch_ops: list[TorchOp]
    interpreted: bool

    @property
    def dram_bytes(self) -> int:
        return sum(l.dram_bytes() for l in self.launches) + sum(o.n_bytes for o in self.torch_ops)

    @property
    def sector_use(self) -> float | None:
        """Requested over sector bytes across every kernel request (None: no kernel request)."""
        s = sum(l.sector_bytes for l in self.launches)
        return sum(l.requested_bytes for l in self.launches) / s if s else None

    def per_launch(self) -> list[dict[str, Any]]:
        return [{"kernel": l.name, "requests": l.n_requests, "dram_bytes": l.dram_bytes(),
                 "sector_use": l.requested_bytes / l.sector_bytes if l.sector_bytes else None,
                 "load_sector_use": l.side_use("load"), "store_sector_use": l.side_use("store")}
                for l in self.launches] + [{"torch_op": o.name, "dram_bytes": o.n_bytes} for o in self.torch_ops]


class _TorchBytes(TorchDispatchMode):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.state["in_launch"] or name in _NO_DATA or getattr(func, "is_view", False):
            return out
        ins = [a for a in list(args) + list((kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        if name.endswith("_") and ins:  # in place: the first argument is written (and read unless copy_)
            written, read = [ins[0]], ins[1:] if name in ("copy_", "fill_", "zero_") else ins
        else:
            written, read = outs, ins
        n = sum(t.numel() * t.element_size() for t in read + written)
        self.state["ops"].append(TorchOp(name, n))
        return out


#: lanes of a warp: one memory request
WARP_LANES = 32
#: bytes one lane loads at once where its addresses are contiguous (a 128-bit vector access)
LANE_VECTOR_BYTES = 16


def _warp_groups(addr: np.ndarray, mask: np.ndarray, itemsize: int) -> tuple[list[np.ndarray], int]:
    """Split one block request into warp requests as Triton's coalescing lays them out: lanes walk
    the pointer block's contiguous axis (where one exists), ``LANE_VECTOR_BYTES`` per lane there;
    else one element per lane, in the block's row-major order. Returns each warp request's
    addresses (masked-off lanes dropped) and the bytes asked for."""
    addr = np.asarray(addr)
    m = np.broadcast_to(np.asarray(mask), addr.shape)
    per_lane = 1
    if addr.ndim >= 1 and addr.size > 1:
        a = addr.astype(np.int64)
        for ax in range(addr.ndim - 1, -1, -1):
            if addr.shape[ax] > 1 and np.all(np.diff(a, axis=ax) == itemsize):
                addr, m = np.moveaxis(addr, ax, -1), np.moveaxis(m, ax, -1)
                per_lane = max(1, LANE_VECTOR_BYTES // itemsize)
                break
    flat, fm = addr.reshape(-1), m.reshape(-1)
    step = WARP_LANES * per_lane
    groups = [flat[i:i + step][fm[i:i + step]] for i in range(0, flat.size, step)]
    return [g for g in groups if g.size], int(fm.sum()) * itemsize


def _sectors(addr: np.ndarray, itemsize: int) -> np.ndarray:
    addr = addr.astype(np.uint64)
    first, last = addr // SECTOR_BYTES, (addr + np.uint64(itemsize - 1)) // SECTOR_BYTES
    return np.unique(np.concatenate([first, last]))


def meter(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, Traffic]:
    """Call ``fn(*args)`` and count its memory traffic (see the module docstring)."""
    state: dict[str, Any] = {"in_launch": False, "ops": [], "launches": []}
    interp = tritonenv.INTERPRETED
    patches = []
    try:
        from triton.runtime import interpreter as I
    except ImportError:  # pragma: no cover - Triton is a dependency
        I = None
    if I is not None:
        B, F = I.InterpreterBuilder, I.InterpretedFunction
        orig_load, orig_store, orig_run = B.create_masked_load, B.create_masked_store, F.run

        def load(self, ptrs, mask, *a, **k):
            _add(state, ptrs, mask, write=False)
            return orig_load(self, ptrs, mask, *a, **k)

        def store(self, ptrs, value, mask, *a, **k):
            _add(state, ptrs, mask, write=True)
            return orig_store(self, ptrs, value, mask, *a, **k)

        def run(self, *a, **k):
            state["launches"].append(Launch(getattr(self.fn, "__name__", str(self.fn))))
            state["in_launch"] = True
            try:
                return orig_run(self, *a, **k)
            finally:
                state["in_launch"] = False

        for cls, name, new, old in ((B, "create_masked_load", load, orig_load),
                                    (B, "create_masked_store", store, orig_store), (F, "run", run, orig_run)):
            setattr(cls, name, new)
            patches.append((cls, name, old))
    try:
        with _TorchBytes(state):
            out = fn(*args)
    finally:
        for cls, name, old in patches:
            setattr(cls, name, old)
    return out, Traffic(state["launches"], state["ops"], bool(interp))


def _itemsize(ptrs) -> int:
    return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)


def _add(state, ptrs, mask, write: bool) -> None:
    if not state["launches"]:
        return
    itemsize = _itemsize(ptrs)
    groups, requested = _warp_groups(ptrs.data, mask.data, itemsize)
    if not requested:
        return
    l = state["launches"][-1]
    per_warp = [_sectors(g, itemsize) for g in groups]
    (l.write_sectors if write else l.read_sectors).append(np.concatenate(per_warp))
    sec_bytes = sum(int(p.size) for p in per_warp) * SECTOR_BYTES
    l.requested_bytes += requested
    l.sector_bytes += sec_bytes
    side = l.by_side["store" if write else "load"]
    side[0] += requested
    side[1] += sec_bytes
    l.n_requests += len(groups)
