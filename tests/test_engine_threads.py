"""The engine calls Python makes outside the engine lock, under stress loops: loading a head or an
n-gram table while another thread closes the engine, and copying the cost model while a generation
updates it. Each loop runs in a child process (tests/isolated.py), so a use after free fails one
test with its exit status instead of ending the test run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from isolated import run_json

import pyspec
from pyspec import ngram


@pytest.fixture(scope="module")
def ngram_file(tmp_path_factory: pytest.TempPathFactory, tiny_target: str) -> Path:
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1) as engine:
        sequences = [list(range(i, i + 40)) for i in range(0, 200, 7)]
        columns = ngram.count_ngrams(sequences, min_total=1)
        return ngram.write_table(tmp_path_factory.mktemp("ngram") / "t.ngram", columns,
                                 n_vocab=engine._core.n_vocab, vocab_fingerprint=engine.vocab_fingerprint)


# Loads run back to back on one thread (the GIL is released inside) while the main thread closes
# the engine; every load must finish or raise EngineClosedError, and the first load after close()
# raises it.
LOAD_WHILE_CLOSING = """
import json, sys, threading, time
import pyspec
from pyspec import EngineClosedError
target, path, kind, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
counts = {"loaded": 0, "closed": 0}
for r in range(rounds):
    engine = pyspec.Engine(target, n_ctx=256, n_threads=1)
    core = engine._core
    load = core.load_ngram if kind == "ngram" else core.load_head
    def loop():
        while True:
            try:
                load(path)
                counts["loaded"] += 1
            except EngineClosedError:
                counts["closed"] += 1
                return
    worker = threading.Thread(target=loop)
    worker.start()
    time.sleep(0.002 * (r % 5))
    core.close()
    worker.join()
print(json.dumps(counts))
"""


def test_load_ngram_while_closing(tiny_target: str, ngram_file: Path) -> None:
    counts = run_json(LOAD_WHILE_CLOSING, tiny_target, str(ngram_file), "ngram", "60")
    assert counts["closed"] == 60, counts


def test_load_head_while_closing(tiny_target: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from pyspec.head.gguf_io import export_head, new_head, read_target

    vocab = np.arange(300)
    weights = read_target(tiny_target, vocab)
    torch.manual_seed(0)
    head = export_head(new_head(weights, vocab), weights.info, tmp_path / "head.gguf", dtype="f32")
    counts = run_json(LOAD_WHILE_CLOSING, tiny_target, str(head), "head", "60")
    assert counts["closed"] == 60, counts


# Copies of the cost model taken while plain generations observe every step (all of size 1) must
# each be one state of it: the count of size 1 is the total.
COPY_WHILE_GENERATING = """
import json, sys, threading
import pyspec
from pyspec import _core
engine = pyspec.Engine(sys.argv[1], n_ctx=1024, n_threads=1)
sizes = list(range(1, 2049))  # long vectors: a copy takes long enough to meet a step
engine._core.set_cost(False, _core.CostCurve(sizes, [1.0 + 0.1 * k for k in sizes]), "")
done = threading.Event()
def generate():
    for _ in range(int(sys.argv[2])):
        engine.generate([1, 2, 3], max_tokens=400, method="none", trace_top_k=0)
    done.set()
worker = threading.Thread(target=generate)
worker.start()
copies = torn = 0
while not done.is_set():
    model = engine._core.cost_model()
    copies += 1
    if model.n_observed(1) != model.n_observed_total:  # plain steps: every one has size 1
        torn += 1
worker.join()
print(json.dumps({"copies": copies, "torn": torn, "observed": engine._core.cost_model().n_observed_total}))
"""


def test_cost_model_copies_while_generating(tiny_target: str) -> None:
    out = run_json(COPY_WHILE_GENERATING, tiny_target, "12")
    assert out["observed"] >= 12 * 399 and out["copies"] > 1000, out
    assert out["torn"] == 0, out
