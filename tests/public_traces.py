"""Where tests find public profiler traces from other repositories, which this repository never
commits (their manifest and readings are in tests/data/trace_corpus/): the shared data folder
beside the checkout (``../shared/data/``, relative to the repository) or the folder named by
``HWLAB_TRACE_CORPUS`` (laid out as ``<repository name>/<path there>``, MANIFEST.json's ``file``).
A test that needs one skips, saying which, when neither holds it."""
import hashlib
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CORPUS_ENV = "HWLAB_TRACE_CORPUS"
MANIFEST = ROOT / "tests" / "data" / "trace_corpus" / "MANIFEST.json"
#: the PyTorch 1.8 ResNet-50 trace (pytorch/kineto tb_plugin sample) and HTA's MI250 toy
PYTORCH18 = ("traces2/kineto_resnet50/worker0.pt.trace.json.gz",
             "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz")
MI250 = (None, "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")


def corpus_dir() -> Path | None:
    v = os.environ.get(CORPUS_ENV)
    return Path(v) if v else None


def sha256_ok(path: Path, corpus_rel: str) -> bool:
    rows = {r["file"]: r for r in json.loads(MANIFEST.read_text())["traces"]}
    want = rows.get(corpus_rel)
    return want is None or hashlib.sha256(path.read_bytes()).hexdigest() == want["sha256"]


def public_trace(which: tuple[str | None, str | None]) -> Path:
    """The trace ``which`` = (path under ../shared/data, path under $HWLAB_TRACE_CORPUS), or skip."""
    shared_rel, corpus_rel = which
    if shared_rel and (SHARED / shared_rel).is_file():
        return SHARED / shared_rel
    c = corpus_dir()
    if corpus_rel and c and (c / corpus_rel).is_file():
        if not sha256_ok(c / corpus_rel, corpus_rel):
            pytest.fail(f"{c / corpus_rel}: its sha256 differs from tests/data/trace_corpus/MANIFEST.json")
        return c / corpus_rel
    pytest.skip(f"public trace not here: {shared_rel or corpus_rel} (in ../shared/data/, or ${CORPUS_ENV} holding "
                f"tests/data/trace_corpus/MANIFEST.json's files)")
