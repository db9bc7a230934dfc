"""Datasheet peaks for the GPUs people run hwlab on, each number with its source.

These are *peaks*, the vendor's upper bounds; they are kept apart from what a machine
measured (:mod:`hwlab.core.ceilings`). Labs judge "% of ceiling" against the measured figure;
the spec is there to tell a slow *card* (measured far under its datasheet) from a slow
*kernel* (far under what the card measured).

Conventions:
* Tensor-core rates are **dense** (no 2:4 sparsity). Where a datasheet gives only the
  sparse figure, the dense one is half of it and the comment says so.
* bf16/fp16/fp8 rates are with FP32 accumulate unless noted.
* ``None`` means the source gives no figure or the GPU has no such tensor path (no FP8 before
  Ada/Hopper and CDNA 3; no BF16 on Volta and Turing, whose FP16 tensor rate is ``fp16_tflops``);
  the lab then uses measured ceilings only. ``fp16_tflops`` is kept only where it differs from
  the bf16 rate (or bf16 does not exist); elsewhere fp16 reads the bf16 figure.
* ``hbm_gbps`` is bytes per second / 1e9 as the vendor states it (decimal GB).

An unknown GPU raises :class:`UnknownGPUError` with what to do; nothing is guessed.

A MIG slice (a device name with ``MIG <profile>``, as CUDA names one, e.g. ``NVIDIA H200 MIG 1g.18gb``)
gets the whole GPU's peaks scaled to its slices (:func:`scale_to_mig`, source :data:`MIG_SOURCE`).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GPUSpec:
    name: str
    arch: str
    sm_count: int
    mem_gib: float
    hbm_gbps: float
    fp32_tflops: float | None
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    l2_mib: float | None
    host_link: str
    sources: tuple[str, ...] = field(default_factory=tuple)
    notes: str = ""
    fp16_tflops: float | None = None

    def peak_tflops(self, dtype: str) -> float | None:
        key = {"float32": "fp32", "fp32": "fp32", "tf32": "tf32", "bfloat16": "bf16",
               "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "fp8": "fp8",
               "float8_e4m3fn": "fp8"}.get(dtype)
        if key is None:
            raise KeyError(f"no peak kept for dtype {dtype!r}; use fp32, tf32, bf16, fp16 or fp8")
        if key == "fp16":
            return self.fp16_tflops if self.fp16_tflops is not None else self.bf16_tflops
        return getattr(self, f"{key}_tflops")

    def ridge_point(self, dtype: str = "bf16") -> float | None:
        """Arithmetic intensity (FLOP/byte) where the datasheet roofline bends."""
        peak = self.peak_tflops(dtype)
        return None if peak is None else peak * 1e12 / (self.hbm_gbps * 1e9)

    def to_dict(self) -> dict:
        return asdict(self)


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), SXM/PCIe columns, dense = sparse/2"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), H200 SXM column, dense = sparse/2"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100); A100 whitepaper for SM count/L2"
_MI250_DS = ("AMD Instinct MI250X / MI250 data sheets (amd.com/en/products/accelerators/instinct/mi200): package "
             "MI250X 220 CUs, FP32 matrix 95.7, FP16/BF16 383 TFLOPS; MI250 208 CUs, 90.5, 362.1 TFLOPS; "
             "128 GB HBM2e at 3.2 TB/s")
_MI250_ARCH = ("ROCm documentation, AMD Instinct MI250 microarchitecture (rocm.docs.amd.com, conceptual/gpu-arch/"
               "mi250): each GCD is a device with 104 CUs (MI250) and 1.6 TB/s of HBM2e; AMD CDNA 2 architecture "
               "whitepaper: 8 MB L2 per GCD")
_HOPPER_WP = "NVIDIA H100 (Hopper) architecture whitepaper: 132 SMs (SXM5), 114 SMs (PCIe), 50 MB L2"

SPECS: dict[str, GPUSpec] = {s.name: s for s in [
    GPUSpec("H100 SXM", "sm_90", 132, 80, 3350, 67.0, 494.7, 989.4, 1978.9, 50,
            "PCIe Gen5 x16", (_H100_DS, _HOPPER_WP)),
    GPUSpec("H100 PCIe", "sm_90", 114, 80, 2000, 51.0, 378.0, 756.0, 1513.0, 50,
            "PCIe Gen5 x16", (_H100_DS, _HOPPER_WP)),
    GPUSpec("H200", "sm_90", 132, 141, 4800, 67.0, 494.7, 989.4, 1978.9, 60,
            "PCIe Gen5 x16", (_H200_DS, _HOPPER_WP),
            notes="Same compute as H100 SXM; more, faster HBM3e. L2: 60 MiB as torch reports "
                  "(L2_cache_size) on the H200 this kit was recorded on."),
    GPUSpec("A100 SXM 80GB", "sm_80", 108, 80, 2039, 19.5, 156.0, 312.0, None, 40,
            "PCIe Gen4 x16", (_A100_DS,)),
    GPUSpec("A100 SXM 40GB", "sm_80", 108, 40, 1555, 19.5, 156.0, 312.0, None, 40,
            "PCIe Gen4 x16", (_A100_DS,)),
    GPUSpec("A100 PCIe 80GB", "sm_80", 108, 80, 1935, 19.5, 156.0, 312.0, None, 40,
            "PCIe Gen4 x16", (_A100_DS,)),
    GPUSpec("A100 PCIe 40GB", "sm_80", 108, 40, 1555, 19.5, 156.0, 312.0, None, 40,
            "PCIe Gen4 x16", (_A100_DS,)),
    GPUSpec("L40S", "sm_89", 142, 48, 864, 91.6, 183.0, 362.05, 733.0, 96,
            "PCIe Gen4 x16",
            ("NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): TF32 366, BF16 733, "
             "FP8 1466 TFLOPS with sparsity; dense = /2",)),
    GPUSpec("L4", "sm_89", 58, 24, 300, 30.3, 60.0, 121.0, 242.5, 48,
            "PCIe Gen4 x16",
            ("NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4): TF32 120, BF16 242, "
             "FP8 485 TFLOPS with sparsity; dense = /2",)),
    GPUSpec("A10", "sm_86", 72, 24, 600, 31.2, 62.5, 125.0, None, 6,
            "PCIe Gen4 x16",
            ("NVIDIA A10 datasheet (nvidia.com/en-us/data-center/products/a10-gpu): TF32 125, "
             "BF16 250 TFLOPS with sparsity; dense = /2",)),
    GPUSpec("RTX 4090", "sm_89", 128, 24, 1008, 82.6, 82.6, 165.2, 330.3, 72,
            "PCIe Gen4 x16",
            ("NVIDIA Ada Lovelace architecture whitepaper (v2.1), Appendix A, GeForce RTX 4090: "
             "dense tensor TFLOPS with FP32 accumulate (BF16 165.2; FP8 330.3 is with FP16 "
             "accumulate, 165.2 with FP32)",),
            notes="GeForce parts run FP16/BF16 tensor math with FP32 accumulate at half rate."),
    GPUSpec("V100 SXM2", "sm_70", 80, 32, 900, 15.7, None, None, None, 6,
            "PCIe Gen3 x16",
            ("NVIDIA Tesla V100 datasheet (nvidia.com/en-us/data-center/v100), SXM2 column: FP32 15.7, "
             "Tensor Performance 125 TFLOPS (FP16 with FP32 accumulate, dense: Volta has no sparsity), "
             "900 GB/s HBM2; Volta whitepaper: 80 SMs, 6 MB L2",),
            notes="No TF32, BF16 or FP8 on Volta: only FP16 runs on its tensor cores (fp16_tflops); fp32 "
                  "matmuls run on the CUDA cores (sgemm).", fp16_tflops=125.0),
    GPUSpec("MI300X", "gfx942", 304, 192, 5300, 163.4, 653.7, 1307.4, 2614.9, 256,
            "PCIe Gen5 x16",
            ("AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): "
             "peak FP32 vector 163.4, TF32 matrix 653.7, FP16/BF16 1307.4, FP8 2614.9 TFLOPS dense (the "
             "sheet's 'with structured sparsity' figures are twice these), 5.3 TB/s HBM3, 304 CUs",),
            notes="l2_mib holds the 256 MB AMD Infinity Cache (the last-level cache); each XCD's own L2 is 4 MB."),
    GPUSpec("MI325X", "gfx942", 304, 256, 6000, 163.4, 653.7, 1307.4, 2614.9, 256,
            "PCIe Gen5 x16",
            ("AMD Instinct MI325X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): "
             "peak FP32 vector 163.4, TF32 653.7, FP16/BF16 1307.4, FP8 2614.9 TFLOPS dense (sparsity doubles "
             "the tensor figures), 256 GB HBM3E at 6 TB/s, 304 CUs",),
            notes="Same CDNA 3 compute as the MI300X; more, faster HBM. l2_mib holds the 256 MB Infinity Cache."),
    GPUSpec("MI250X GCD", "gfx90a", 110, 64, 1600, 47.85, None, 191.5, None, 8,
            "PCIe Gen4 x16",
            (_MI250_DS, _MI250_ARCH),
            notes="One of the package's two GCDs, which ROCm shows as two devices: half the package's "
                  "95.7 FP32-matrix / 383 FP16-BF16 TFLOPS and 3.2 TB/s. fp32 is the FP32 matrix (MFMA) rate "
                  "rocBLAS sgemm can reach (the vector rate is half); no TF32 or FP8 on CDNA 2."),
    GPUSpec("MI250 GCD", "gfx90a", 104, 64, 1600, 45.25, None, 181.05, None, 8,
            "PCIe Gen4 x16",
            (_MI250_DS, _MI250_ARCH),
            notes="One of the package's two GCDs (ROCm shows each as a device, often named only 'AMD Radeon "
                  "Graphics': matched by 104 CUs and 64 GiB): half the package's 90.5 FP32-matrix / 362.1 "
                  "FP16-BF16 TFLOPS and 3.2 TB/s; no TF32 or FP8 on CDNA 2."),
    GPUSpec("T4", "sm_75", 40, 16, 320, 8.1, None, None, None, 4,
            "PCIe Gen3 x16",
            ("NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/tesla-t4): FP32 8.1, mixed "
             "precision (FP16/FP32) 65 TFLOPS (dense: Turing has no sparsity), 320 GB/s GDDR6, 16 GB; Turing "
             "whitepaper: 40 SMs, 4 MB L2",),
            notes="No TF32, BF16 or FP8 on Turing: only FP16 (and int8) run on its tensor cores (fp16_tflops).",
            fp16_tflops=65.0),
    GPUSpec("H800 SXM", "sm_90", 132, 80, 3350, 67.0, 494.7, 989.4, 1978.9, 50,
            "PCIe Gen5 x16",
            ("NVIDIA H800 Tensor Core GPU datasheet (nvidia.com, H800 SXM5 column): FP32 67, TF32 989, "
             "BF16 1979, FP8 3958 TFLOPS with sparsity (dense = /2), 80 GB HBM3 at 3.35 TB/s", _HOPPER_WP),
            notes="The H100 SXM's compute and memory; NVLink cut to 400 GB/s (a communication ceiling, not "
                  "kept here)."),
    GPUSpec("H800 PCIe", "sm_90", 114, 80, 2000, 51.0, 378.0, 756.0, 1513.0, 50,
            "PCIe Gen5 x16",
            ("NVIDIA H800 PCIe datasheet: the H100 PCIe's FP32 51, TF32 756, BF16 1513, FP8 3026 TFLOPS with "
             "sparsity (dense = /2), 80 GB HBM2e at 2 TB/s", _HOPPER_WP)),
    GPUSpec("MI210", "gfx90a", 104, 64, 1638, 45.3, None, 181.0, None, 8,
            "PCIe Gen4 x16",
            ("AMD Instinct MI210 data sheet (amd.com/en/products/accelerators/instinct/mi200/mi210.html): "
             "104 CUs, FP32 vector 22.6, FP32 matrix 45.3, FP16/BF16 181.0 TFLOPS, 64 GB HBM2e at 1.6384 TB/s",
             "AMD CDNA 2 architecture whitepaper: 8 MB L2"),
            notes="fp32 is the FP32 matrix (MFMA) rate; no TF32 or FP8 on CDNA 2. Matched by name only: its "
                  "CU count and memory equal an MI250 GCD's (lookup_by_props)."),
    GPUSpec("GH200", "sm_90", 132, 96, 4000, 67.0, 494.7, 989.4, 1978.9, 50,
            "NVLink-C2C",
            ("NVIDIA GH200 Grace Hopper Superchip datasheet (nvidia.com/en-us/data-center/grace-hopper-superchip): "
             "FP32 67, TF32 989, BF16 1979, FP8 3958 TFLOPS with sparsity (dense = /2), 96 GB HBM3 at 4 TB/s",
             _HOPPER_WP),
            notes="The 144 GB HBM3e version reaches 4.9 TB/s: pass --baseline with the node's measured record "
                  "for its ceilings."),
    GPUSpec("B200", "sm_100", 148, 180, 8000, None, 1100.0, 2250.0, 4500.0, None,
            "PCIe Gen5 x16",
            ("NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx): per GPU TF32 2.2, "
             "BF16 4.5, FP8 9 PFLOPS with sparsity, 8 TB/s HBM3e; dense = /2",),
            notes="FP32 and L2 not stated in the source used; SM count per NVIDIA's Blackwell "
                  "(B200) material. Treat as leads until a B200 is measured."),
]}

# name fragments (lower case) seen in torch.cuda.get_device_name / NVML names -> spec key
_ALIASES: list[tuple[str, str]] = [
    (r"gh200", "GH200"),
    (r"h200", "H200"),
    (r"h100.*(pcie|nvl)", "H100 PCIe"),
    (r"h100", "H100 SXM"),
    (r"a100.*pcie.*80|a100 80gb pcie|a100-pcie-80", "A100 PCIe 80GB"),
    (r"a100.*pcie|a100-pcie", "A100 PCIe 40GB"),
    (r"a100.*80", "A100 SXM 80GB"),
    (r"a100", "A100 SXM 40GB"),
    (r"l40s", "L40S"),
    (r"\bl4\b", "L4"),
    (r"\ba10\b(?!0)", "A10"),
    (r"4090", "RTX 4090"),
    (r"b200", "B200"),
    (r"h800.*(pcie|nvl)", "H800 PCIe"),
    (r"h800", "H800 SXM"),
    (r"mi210", "MI210"),
    (r"v100", "V100 SXM2"),
    (r"mi300x", "MI300X"),
    (r"mi325x", "MI325X"),
    (r"mi250x", "MI250X GCD"),
    (r"mi250", "MI250 GCD"),
    (r"\bt4\b", "T4"),
]


#: where the slice fractions come from; the bandwidth and L2 of a slice follow its memory slices and
#: its compute its SM slices (the guide's columns "Fraction of Memory", "Fraction of SMs", "L2 Cache Size")
MIG_SOURCE = ("NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (docs.nvidia.com/datacenter/"
              "tesla/mig-user-guide/supported-mig-profiles.html), A100/H100/H200 tables: profile Ng.Mgb has "
              "N/7 of the SMs and 1/8, 2/8, 4/8 or all of the memory and L2 (1g.18gb on H200: 1/7 SMs, 1/8 "
              "memory); peaks scaled by those fractions, the guide's nominal split, not a measurement")
#: compute (GPC) slices of a whole GPU and memory slices, in the guide's tables for A100/H100/H200
MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES = 7, 8


def mig_profile(device_name: str) -> str | None:
    """The MIG profile in a device name (``1g.18gb``), or None for a whole GPU."""
    m = re.search(r"\bMIG\s+(\d+g\.\d+gb)", device_name, re.I)
    return m.group(1).lower() if m else None


def mig_fractions(profile: str, whole: GPUSpec) -> tuple[int, int]:
    """(compute slices of 7, memory slices of 8) of ``profile`` on ``whole``: the ``Ng`` of its
    name, and its memory as a share of the whole GPU's rounded to the guide's 1, 2, 4 or 8 eighths."""
    m = re.fullmatch(r"(\d+)g\.(\d+)gb", profile)
    if not m or not 1 <= int(m.group(1)) <= MIG_COMPUTE_SLICES:
        raise UnknownGPUError(f"MIG profile {profile!r} is not of the form Ng.Mgb with N of 1..7")
    eighths = int(m.group(2)) / (whole.mem_gib * 1.073741824) * MIG_MEMORY_SLICES  # GiB -> the name's GB
    mem = min((1, 2, 4, 8), key=lambda e: abs(e - eighths))
    return int(m.group(1)), mem


def scale_to_mig(whole: GPUSpec, profile: str) -> GPUSpec:
    """``whole``'s peaks scaled to a MIG slice (:data:`MIG_SOURCE`): rates and SMs by its compute
    slices of 7, bandwidth, memory and L2 by its memory slices of 8."""
    c, mem = mig_fractions(profile, whole)
    fc, fm = c / MIG_COMPUTE_SLICES, mem / MIG_MEMORY_SLICES

    def sc(v: float | None, f: float) -> float | None:
        return None if v is None else v * f

    return GPUSpec(f"{whole.name} MIG {profile}", whole.arch, int(whole.sm_count * fc), whole.mem_gib * fm,
                   whole.hbm_gbps * fm, sc(whole.fp32_tflops, fc), sc(whole.tf32_tflops, fc),
                   sc(whole.bf16_tflops, fc), sc(whole.fp8_tflops, fc), sc(whole.l2_mib, fm), whole.host_link,
                   whole.sources + (MIG_SOURCE,),
                   (whole.notes + " " if whole.notes else "") + f"MIG slice {profile}: {c}/7 of the SMs "
                   f"(compute peaks), {mem}/8 of the memory (bandwidth, L2); nominal, from the guide's table")


#: entries matched by their name only, never by compute units and memory: the MI210 has an MI250 GCD's
#: 104 CUs and 64 GB (and its peaks within 1%), so a bare name reads as the MI250 GCD, as before
NAME_ONLY = ("MI210",)


def lookup_by_props(name: str, n_sm: Any, mem_bytes: Any) -> GPUSpec | None:
    """A GPU whose name says only its vendor (ROCm often names an Instinct GCD 'AMD Radeon Graphics'):
    the one AMD entry with exactly its compute-unit count and its memory within 5%. None where the
    name is not a bare AMD one, or no entry or several match; nothing is guessed from the count alone."""
    if not re.fullmatch(r"\s*(amd\s+)?radeon\s+graphics\s*|\s*amd\s+instinct\s*", name.lower()):
        return None
    if not isinstance(n_sm, int) or not isinstance(mem_bytes, (int, float)) or mem_bytes <= 0:
        return None
    gib = mem_bytes / 2**30
    hits = [sp for sp in SPECS.values() if sp.arch.startswith("gfx") and sp.sm_count == n_sm
            and abs(sp.mem_gib - gib) <= 0.05 * sp.mem_gib and sp.name not in NAME_ONLY]
    return hits[0] if len(hits) == 1 else None


class UnknownGPUError(KeyError):
    """No datasheet entry for this GPU name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0])


def lookup(device_name: str) -> GPUSpec:
    """The spec for a device name as torch or NVML reports it (e.g. 'NVIDIA H200').

    Raises :class:`UnknownGPUError` (with the list of known parts) for anything else.
    """
    n = device_name.lower()
    for pattern, key in _ALIASES:
        if re.search(pattern, n):
            profile = mig_profile(device_name)
            return scale_to_mig(SPECS[key], profile) if profile else SPECS[key]
    raise UnknownGPUError(
        f"no datasheet entry for {device_name!r} (known: {', '.join(SPECS)}). hwlab still "
        "works: it judges kernels against the ceilings this machine measures "
        "(hwlab doctor --remeasure). To add the part, extend hwlab.core.specs.SPECS with its "
        "datasheet figures and their source."
    )


def try_lookup(device_name: str) -> GPUSpec | None:
    try:
        return lookup(device_name)
    except UnknownGPUError:
        return None
