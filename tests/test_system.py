"""NVML absent, partial and full, without a GPU: a fake pynvml that answers some queries
and raises NVML's NotSupported for others, plus the real snapshot recorded on the H200."""
import types

import pytest

from hwlab.core import system
from hwlab.core.evidence import recorded


class NVMLError_NotSupported(Exception):
    pass


def fake_nvml(*, temp=40, reasons=0x1, unsupported=(), uncorrected=0, gen=(5, 5)):
    m = types.SimpleNamespace()
    for name in ["NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_CLOCK_MEM",
                 "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
                 "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC",
                 "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
                 "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"]:
        setattr(m, name, name)
    m.NVML_NVLINK_MAX_LINKS = 4

    def q(name, value):
        def f(*a):
            if name in unsupported:
                raise NVMLError_NotSupported("Not Supported")
            return value(*a) if callable(value) else value
        setattr(m, name, f)

    q("nvmlInit", None)
    q("nvmlShutdown", None)
    q("nvmlSystemGetDriverVersion", "580.1")
    q("nvmlSystemGetCudaDriverVersion_v2", 13000)
    q("nvmlDeviceGetCount", 1)
    q("nvmlDeviceGetHandleByIndex", "h0")
    q("nvmlDeviceGetName", b"NVIDIA H200")
    q("nvmlDeviceGetUUID", "GPU-1")
    q("nvmlDeviceGetPciInfo", types.SimpleNamespace(busId="0000:00:06.0"))
    q("nvmlDeviceGetTemperature", temp)
    q("nvmlDeviceGetPowerUsage", 300000)
    q("nvmlDeviceGetEnforcedPowerLimit", 700000)
    q("nvmlDeviceGetClockInfo", 1980)
    q("nvmlDeviceGetMaxClockInfo", 1980)
    q("nvmlDeviceGetCurrentClocksEventReasons", reasons)
    q("nvmlDeviceGetCurrentClocksThrottleReasons", reasons)
    q("nvmlDeviceGetEccMode", (1, 1))
    q("nvmlDeviceGetTotalEccErrors", lambda h, kind, where: uncorrected
      if kind.endswith("UNCORRECTED") else 0)
    q("nvmlDeviceGetRetiredPages", [])
    q("nvmlDeviceGetRemappedRows", (0, 0, 0, 0))
    q("nvmlDeviceGetCurrPcieLinkGeneration", gen[0])
    q("nvmlDeviceGetMaxPcieLinkGeneration", gen[1])
    q("nvmlDeviceGetCurrPcieLinkWidth", 16)
    q("nvmlDeviceGetMaxPcieLinkWidth", 16)
    q("nvmlDeviceGetNvLinkState", 1)
    q("nvmlDeviceGetNvLinkRemotePciInfo", types.SimpleNamespace(busId="0000:00:07.0"))
    q("nvmlDeviceGetUtilizationRates", types.SimpleNamespace(gpu=90, memory=40))
    q("nvmlDeviceGetMemoryInfo", types.SimpleNamespace(used=2**30, total=2**37))
    q("nvmlDeviceGetNumaNodeId", 0)
    return m


def test_no_nvml_is_a_clear_non_fatal_state():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")
    snap = system.snapshot(Broken())
    assert snap["nvml"]["available"] is False
    assert "No NVIDIA driver" in snap["nvml"]["reason"]
    assert snap["gpus"] == []
    assert system.health_flags(snap)[0].startswith("NVML unavailable")


def test_this_machine_without_a_driver():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU machine")
    snap = system.snapshot()
    assert snap["nvml"]["available"] is False and snap["versions"]["torch"]


def test_partial_nvml_marks_fields_unsupported_not_errors():
    snap = system.snapshot(fake_nvml(unsupported={"nvmlDeviceGetNvLinkState",
                                                  "nvmlDeviceGetRetiredPages",
                                                  "nvmlDeviceGetNumaNodeId"}))
    g = snap["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["temperature_c"] == 40
    assert system.is_unsupported(g["nvlink"])
    assert system.is_unsupported(g["retired_pages"])
    assert system.is_unsupported(g["numa_node"])
    assert g["remapped_rows"]["pending"] == 0
    assert system.health_flags(snap) == []


def test_full_nvml_reports_links_and_versions():
    snap = system.snapshot(fake_nvml())
    g = snap["gpus"][0]
    assert len(g["nvlink"]) == 4 and g["nvlink"][0]["active"] is True
    assert snap["versions"]["driver"] == "580.1"
    assert g["power_w"] == 300.0 and g["clock_event_reasons"] == ["gpu_idle"]


def test_health_flags_catch_throttle_ecc_heat_and_link():
    snap = system.snapshot(fake_nvml(temp=90, reasons=0x4 | 0x40, uncorrected=2, gen=(3, 5)))
    flags = " | ".join(system.health_flags(snap))
    assert "temperature 90" in flags
    assert "sw_power_cap" in flags and "hw_thermal_slowdown" in flags
    assert "2 uncorrected ECC" in flags
    assert "PCIe Gen3 x16 now (max Gen5 x16)" in flags


def test_decode_clock_reasons():
    assert system.decode_clock_reasons(0) == ["none"]
    assert system.decode_clock_reasons(0x1 | 0x20) == ["gpu_idle", "sw_thermal_slowdown"]


def test_recorded_h200_snapshot_replays():
    ev = recorded("doctor")
    snap = ev.snapshot
    assert snap["nvml"]["available"] is True
    g = snap["gpus"][0]
    assert g["name"] == "NVIDIA H200"
    # the one-GPU VM answers NotSupported for NVLink: recorded as such, not as an error
    assert system.is_unsupported(g["nvlink"])
    assert isinstance(system.health_flags(snap), list)


def test_nvml_session_shuts_down_whatever_happens_inside():
    calls = []
    m = types.SimpleNamespace(nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("down"))
    with pytest.raises(KeyError):
        with system.nvml_session(m) as (nvml, why):
            assert nvml is m and why is None
            raise KeyError("a query failed")
    assert calls == ["init", "down"]

    def broken():
        raise RuntimeError("NVML Shared Library Not Found")
    with system.nvml_session(types.SimpleNamespace(nvmlInit=broken)) as (nvml, why):
        assert nvml is None and "NVML could not start" in why and "Shared Library" in why
