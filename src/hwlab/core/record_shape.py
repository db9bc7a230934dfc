"""The shape of every record and cache hwlab reads back: which fields are objects, lists, text,
numbers or flags, checked once on read so no reader meets a field of the wrong type.

Core floor. :func:`hwlab.core.evidence.load` (evidence, baselines, doctor and lab records) and
:func:`hwlab.core.ceilings.load_cached` (the ceilings cache) call :func:`check_evidence` and
:func:`check_ceilings_cache`; the number ranges themselves are :mod:`hwlab.core.validate`'s. A
field the kit writes with one type and that holds another (an object where a list belongs, ``"80"``
where a percentage belongs, null where a mapping is read) raises :class:`ShapeError` naming the
field by its JSON path, so the command refuses the file in one line (exit 2) instead of failing
inside a comparison. Fields a record may lack stay optional; fields no reader reads are not
checked (a record body is the lab's own and is only shown, as recorded).

The specs are small tuples: ``STR``, ``NUM`` (finite int or float, not a bool), ``INT``,
``BOOL``, ``SCALAR`` (text, number, flag or null: shown as recorded), ``opt(spec)`` (null
allowed), ``obj({key: spec}, values=spec)`` (an object whose listed keys, where present, have
their spec, and whose every other value has ``values``), ``seq(spec)`` (a list of spec).
"""
from __future__ import annotations

import math
from typing import Any

from hwlab.errors import UserInputError


class ShapeError(UserInputError):
    """A record field of the wrong type; the message names it by its JSON path."""


STR, NUM, INT, BOOL, SCALAR, ANY = ("str",), ("num",), ("int",), ("bool",), ("scalar",), ("any",)


def opt(spec: tuple) -> tuple:
    return ("opt", spec)


def obj(keys: dict[str, tuple] | None = None, values: tuple = ANY) -> tuple:
    return ("obj", keys or {}, values)


def seq(item: tuple) -> tuple:
    return ("seq", item)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "text"
    return "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else type(v).__name__


_WANT = {"str": "text", "num": "a finite number", "int": "a whole number", "bool": "true or false",
         "scalar": "text, a number, true/false or null", "obj": "an object", "seq": "a list"}

#: the largest magnitude a recorded number may have: past a float's range no figure is a measurement
MAX_ABS = 1e300


def check(v: Any, spec: tuple, where: str) -> None:
    """Raise :class:`ShapeError` when ``v`` does not have ``spec`` (module docstring)."""
    tag = spec[0]
    if tag == "any":
        return
    if tag == "opt":
        if v is not None:
            check(v, spec[1], where)
        return
    ok = {"str": lambda: isinstance(v, str),
          "num": lambda: _is_num(v),
          "int": lambda: _is_num(v) and float(v) == int(v),
          "bool": lambda: isinstance(v, bool),
          "scalar": lambda: v is None or isinstance(v, (str, bool)) or _is_num(v),
          "obj": lambda: isinstance(v, dict),
          "seq": lambda: isinstance(v, list)}[tag]()
    if not ok:
        raise ShapeError(f"{where} should be {_WANT[tag]}, not {_kind(v)}{_peek(v)}")
    if tag == "obj":
        keys, values = spec[1], spec[2]
        for k, x in v.items():
            check(x, keys.get(k, values), f"{where}.{k}")
    elif tag == "seq":
        for i, x in enumerate(v):
            check(x, spec[1], f"{where}[{i}]")


def _is_num(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v)) and abs(float(v)) <= MAX_ABS
    except OverflowError:  # an integer past the largest float
        return False


def _peek(v: Any) -> str:
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        text = repr(v) if not isinstance(v, int) or len(str(v)) < 40 else f"{len(str(v))} digits"
        return f" ({text[:40]})"
    return ""


_COUNTERS = opt(("any",))  # NVML ECC / remap counters: object, "unsupported" text or null (validate.snapshot)
GPU_STATE = obj({
    "index": opt(INT), "name": opt(STR), "pci_bus_id": opt(STR), "uuid": opt(STR),
    "temperature_c": opt(NUM), "power_w": opt(NUM), "power_limit_w": opt(NUM),
    "sm_clock_mhz": opt(NUM), "sm_clock_max_mhz": opt(NUM), "mem_clock_mhz": opt(NUM),
    "mem_clock_max_mhz": opt(NUM), "clock_event_reasons": opt(seq(STR)),
    # compared for equality only (a change is the finding), any JSON value reads
    "pcie_gen_max": ANY, "pcie_width_max": ANY, "numa_node": ANY,
    "ecc_errors_volatile": _COUNTERS, "ecc_errors_aggregate": _COUNTERS, "remapped_rows": _COUNTERS,
})
SNAPSHOT = obj({"gpus": opt(seq(GPU_STATE)), "versions": opt(obj(values=SCALAR)), "host": opt(STR),
                "taken_at": opt(STR), "cpu_count": opt(NUM), "nvml": opt(obj())})
TOPOLOGY = obj({"gpus": seq(STR), "nics": opt(seq(STR)), "links": obj(values=STR), "source": opt(STR),
                "cpu_affinity": opt(obj()), "numa_affinity": opt(obj()), "nic_names": opt(obj())})
RUNTIME_PATH = obj({"hit_rate_pct": opt(NUM), "fallback_rate_pct": opt(NUM),
                    "default_dtype": SCALAR, "float32_matmul_precision": SCALAR})
RESULT = obj({"name": STR, "device": opt(STR), "timer": opt(STR), "ceiling_source": opt(STR),
              # us_per_launch: a latency probe's measured result, compared as a number (baseline_compare)
              "params": obj({"us_per_launch": NUM}), "gpu_share": opt(obj()), "rel_err": opt(NUM),
              "tol": opt(NUM)})
MACHINE = obj({"device": opt(STR), "is_gpu": opt(BOOL), "host": opt(STR), "sm_count": opt(NUM),
               "total_mem_gib": opt(NUM), "l2_bytes": opt(NUM), "cc": opt(STR)})
CEILINGS = obj({"device": STR, "copy_gbps": opt(NUM), "gemm_tflops": obj(values=NUM),
                "host_link_gbps": opt(NUM), "measured_at": STR, "source": STR, "host": opt(STR),
                "n_threads": opt(INT), "bands": opt(obj(values=obj({
                    "t_ms": NUM, "t_p10_ms": NUM, "t_p90_ms": NUM, "n_rep": INT, "timer": opt(STR),
                    "params": obj(), "gpu_share": opt(obj())})))})
EVIDENCE = obj({
    "kind": STR, "recorded_at": STR, "machine": MACHINE, "results": seq(RESULT),
    "versions": opt(obj(values=SCALAR)), "ceilings": opt(CEILINGS), "snapshot": opt(SNAPSHOT),
    "extra": opt(obj({"topology": opt(TOPOLOGY), "runtime_path": opt(RUNTIME_PATH),
                      "missing": opt(obj(values=STR)), "topology_text": opt(STR)})),
})


def check_evidence(d: dict[str, Any]) -> None:
    """Every field of an evidence record that a reader reads has its type (module docstring)."""
    check(d, EVIDENCE, "$")


def check_ceilings_cache(d: dict[str, Any]) -> None:
    """The ceilings cache, field by field; the same spec as a record's ``ceilings``, plus the
    fields a cache must hold (the device and its copy ceiling)."""
    check(d, CEILINGS, "$")
    for key in ("device", "copy_gbps"):
        if d.get(key) is None:
            raise ShapeError(f"$.{key} is missing: a ceilings cache always holds it")
