"""Each lab notebook shows the kernel it measures, read from the running module so it cannot drift."""
import ast
import re
from pathlib import Path

import pytest

from hwlab import nb
from hwlab.labs import bandwidth, crosslink, registers
from hwlab.labs.crosslink import stragglers as ranks

ROOT = Path(__file__).resolve().parents[1]

#: the kernel each lab notebook shows, and the call that first times it
SHOWN = {
    "notebooks/01_bandwidth_bound.py": (bandwidth._fused_chain_kernel, "lab.run("),
    "notebooks/02_registers_occupancy.py": (registers.matmul_kernel, "lab.sweep("),
    "notebooks/03_cross_link_tp.py": (crosslink.block_partial, "lab.experiment("),
}


@pytest.mark.parametrize("fn", [bandwidth._fused_chain_kernel, bandwidth.unfused_chain, registers.matmul_kernel,
                                registers.reference_matmul, crosslink.block_partial, crosslink.block_reference],
                         ids=lambda f: getattr(f, "__name__", str(f)))
def test_shown_source_is_the_code_that_runs(fn):
    src = nb.kernel_source(fn)
    assert len(src.splitlines()) <= nb.SHOW_MAX_LINES
    py = getattr(fn, "fn", fn)  # a @triton.jit kernel wraps the Python function it compiles
    module_defs = {d.name: d for d in ast.parse(Path(py.__code__.co_filename).read_text()).body
                   if isinstance(d, ast.FunctionDef)}
    shown = ast.parse(src).body
    assert len(shown) == 1 and ast.dump(shown[0]) == ast.dump(module_defs[py.__name__])
    if hasattr(fn, "fn"):  # what the notebook tells the reader to look at is there
        assert "tl.load(" in src and "tl.store(" in src and "tl.float32" in src


def test_a_kernel_too_long_to_show_is_refused():
    with pytest.raises(ValueError, match="core loop"):
        nb.kernel_source(ranks.run_rank)
    assert nb.kernel_source(ranks.run_rank, max_lines=10_000).startswith("def run_rank(")


@pytest.mark.parametrize("rel", sorted(SHOWN))
def test_lab_notebook_shows_its_kernel_before_timing_it(rel):
    fn, timing_call = SHOWN[rel]
    cells = re.split(r"^# %%.*$", (ROOT / rel).read_text(), flags=re.M)
    shown = next(i for i, c in enumerate(cells) if "nb.show_kernel(" in c)
    timed = next(i for i, c in enumerate(cells) if timing_call in c)
    assert shown < timed, f"{rel}: show the kernel before timing it"
    assert f"lab.{getattr(fn, 'fn', fn).__name__}" in cells[shown], f"{rel} shows another kernel"
