import pytest

from hwlab.core import specs


@pytest.mark.parametrize("reported,key", [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("AMD Instinct MI210", "MI210"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla T4", "T4"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI250X", "MI250X GCD"),
])
def test_lookup_by_reported_name(reported, key):
    assert specs.lookup(reported).name == key


def test_unknown_gpu_is_a_clear_error():
    with pytest.raises(specs.UnknownGPUError) as e:
        specs.lookup("NVIDIA A40")
    msg = str(e.value)
    assert "A40" in msg and "measures" in msg and "H200" in msg
    assert specs.try_lookup("Tesla K80") is None


def test_every_entry_cites_a_source_and_is_consistent():
    for s in specs.SPECS.values():
        assert s.sources, s.name
        assert s.hbm_gbps > 0 and s.sm_count > 0
        rates = [r for r in (s.fp32_tflops, s.tf32_tflops, s.bf16_tflops, s.fp8_tflops) if r]
        assert rates == sorted(rates), f"{s.name}: dense rates should rise fp32<=tf32<=bf16<=fp8"


def test_ridge_point_and_fp8_absence():
    h200 = specs.lookup("NVIDIA H200")
    assert h200.ridge_point("bf16") == pytest.approx(989.4e12 / 4.8e12)
    assert specs.lookup("NVIDIA A100-SXM4-40GB").peak_tflops("fp8") is None
    with pytest.raises(KeyError):
        h200.peak_tflops("int4")


def test_a_bare_amd_name_is_matched_by_compute_units_and_memory_only():
    """ROCm names an MI250 GCD 'AMD Radeon Graphics': 104 CUs and 64 GiB pick the one entry that has
    both; a count that fits none, memory off by more than 5%, or a named NVIDIA part is not matched."""
    gib = 2 ** 30
    assert specs.lookup_by_props("AMD Radeon Graphics", 104, 64 * gib).name == "MI250 GCD"
    assert specs.lookup_by_props("AMD Radeon Graphics", 110, 64 * gib).name == "MI250X GCD"
    assert specs.lookup_by_props("AMD Radeon Graphics", 104, 80 * gib) is None
    assert specs.lookup_by_props("AMD Radeon Graphics", 96, 64 * gib) is None
    assert specs.lookup_by_props("NVIDIA A100-SXM4-40GB", 108, 40 * gib) is None
    for name in ("MI300X", "MI325X", "MI250X GCD", "MI250 GCD", "V100 SXM2", "T4", "GH200"):
        sp = specs.SPECS[name]
        assert sp.sources and sp.hbm_gbps > 0 and sp.peak_tflops("fp16") and sp.fp32_tflops < sp.peak_tflops("fp16")


def test_each_datasheet_keeps_only_the_tensor_dtypes_its_gpu_has():
    """Volta and Turing have no bf16 (nor tf32, fp8): a bf16 matmul has no peak there, an fp16 one
    has the FP16 tensor rate; CDNA 2 has no tf32 or fp8; Ampere has no fp8; elsewhere fp16 reads bf16."""
    for name in ("V100 SXM2", "T4"):
        sp = specs.SPECS[name]
        assert sp.peak_tflops("bf16") is None and sp.peak_tflops("tf32") is None and sp.peak_tflops("fp8") is None
        assert sp.peak_tflops("float16") > sp.fp32_tflops
    for name in ("MI210", "MI250 GCD", "MI250X GCD"):
        assert specs.SPECS[name].peak_tflops("tf32") is None and specs.SPECS[name].peak_tflops("fp8") is None
    assert specs.SPECS["A100 SXM 80GB"].peak_tflops("fp8") is None
    h = specs.SPECS["H800 SXM"]
    assert h.peak_tflops("fp16") == h.peak_tflops("bf16") == specs.SPECS["H100 SXM"].bf16_tflops
    # a bare ROCm name with an MI210's CUs and memory still reads as the MI250 GCD (name-only MI210)
    assert specs.lookup_by_props("AMD Radeon Graphics", 104, 64 * 2 ** 30).name == "MI250 GCD"
