"""Exercise checkers that grade what each exercise is about, and tell a broken toolchain apart
from a wrong answer. Each exercise works on an instance of its lab's failure that no notebook
shows, and each checker recomputes its answer from that instance's own evidence; a wrong answer
is told the evidence that contradicts it, never the right answer.

* **01 (the transposed chain, :mod:`hwlab.labs.bandwidth.transposed`)**: the learner predicts the
  bytes the eager version moves over the floor (:func:`check_bytes_prediction`, against the access
  meter's count, :mod:`hwlab.core.access_meter`), then writes the kernel
  (:func:`check_transposed_kernel`): it must run *the learner's* Triton kernel. The checker watches
  the call: every Triton kernel launched (``JITFunction.run`` / the interpreter's
  ``InterpretedFunction.run``) and every torch compute op dispatched (``TorchDispatchMode``). It
  refuses an answer that launches a kernel defined in hwlab, torch or triton, that launches none
  of the learner's kernels, or whose arithmetic ran as torch ops. Allocation and copies (``empty``,
  ``empty_like``, ``copy_``, ``clone``) are allowed, and then counted: in the interpreter the bytes
  the call moves must be within :data:`TRANSPOSED_MAX_BYTES_X` of the floor and its warp requests
  must use :data:`TRANSPOSED_MIN_SECTOR_USE` of the sectors they touch; on a GPU, the speed band.
* **02 (the row softmax's occupancy)**: blocks per SM and the binding limit of Lab 2's row softmax
  at a short row (:func:`check_occupancy_prediction`), and the warps count that fills the SM at a
  long one (:func:`check_warps_choice`), both from the static sm_90a ``ptxas -v`` report and
  :mod:`hwlab.labs.registers.occupancy`.
* **03 (a job's rank map)**: on a recorded capture, the rank groups whose GPUs are not linked by
  NVLink, the matrix cells that show it and the leaf (:func:`check_crossing`), and better groups
  over the job's own GPUs (:func:`check_job_mapping`).
* **04 (another layer falls back, :mod:`hwlab.labs.fp8.bucket_case`)**: the bucket, layer kind,
  dequant count and GEMM shape, from a live profile of each bucket (:func:`check_case_fallback`),
  and a bucket mix with no fallback (:func:`check_case_batches`), re-profiled.

Each exercise's checks live in their own module (:mod:`hwlab.course.ex01_checks` ...
:mod:`hwlab.course.ex04_checks`, with :mod:`hwlab.course.own_kernel_check` and
:mod:`hwlab.course.toolchain_check`); this module is their one index, the name the exercises import.

The first versions' checkers stay (:func:`check_own_kernel`, :func:`check_limiter`,
:func:`check_fp8_path`, :func:`check_fallback_bucket`): the head-precision and per-bucket FP8 KV
rules of :func:`check_fp8_path` are graded on Lab 4's recorded H200 bytes.

Every check is declared with :func:`hwlab.course.tries.graded`, naming its reference (what a passing
answer is, recomputed from the same evidence). A wrong answer's feedback prints none of it: not the right
leaf, value, count or groups, the accepted range nor the measured figure, and no figure per try that a
search over answers could read. After three wrong tries ``nb.reveal("<the check's name>")`` shows the
reference and the class record marks the check as revealed (the one mechanism checkpoints use).

A toolchain problem (Triton missing or outside the versions the kit uses, its bundled ptxas
missing or failing) is reported as ``"environment problem"`` with the fix, never as a wrong
answer (:func:`toolchain_problem`).
"""
from __future__ import annotations

from hwlab.course.ex01_checks import *  # noqa: F401,F403
from hwlab.course.ex02_checks import *  # noqa: F401,F403
from hwlab.course.ex03_checks import *  # noqa: F401,F403
from hwlab.course.ex04_checks import *  # noqa: F401,F403
from hwlab.course.own_kernel_check import *  # noqa: F401,F403
from hwlab.course.toolchain_check import *  # noqa: F401,F403
