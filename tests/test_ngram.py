"""Static n-gram tables (pyspec.ngram, spec/ngram_table.h) and method auto's corpus drafter."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import _core, ngram


def _table(engine: pyspec.Engine, sequences: list[list[int]], path: Path, min_total: int = 1) -> Path:
    columns = ngram.count_ngrams(sequences, min_total=min_total)
    return ngram.write_table(path, columns, n_vocab=engine._core.n_vocab, vocab_fingerprint=engine.vocab_fingerprint)


def test_keys_match_the_engine() -> None:
    tokens = np.array([7, 3, 151000, 9, 42, 5], dtype=np.int64)
    for n in (1, 2, 4):
        assert int(ngram.context_keys(tokens, np.array([5]), n)[0]) == _core.ngram_key(tokens[5 - n:5].tolist())
    # Different contexts (and the same tokens at another size) get different keys.
    assert _core.ngram_key([1, 2]) != _core.ngram_key([2, 1]) != _core.ngram_key([1, 2, 2])


def test_counts_keep_the_likeliest_next_token() -> None:
    # After (1, 2): 3 three times, 4 once; after (5, 6): 7 once (dropped by min_total 2).
    cols = ngram.count_ngrams([[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 3], [5, 6, 7]], min_context=2, max_context=2,
                              min_total=2)
    assert len(cols["keys"]) == 1
    assert cols["keys"][0] == _core.ngram_key([1, 2])
    assert (cols["tokens"][0], cols["counts"][0], cols["totals"][0]) == (3, 3, 4)
    # No context crosses from one sequence into the next: (3, 1) is never counted.
    cols = ngram.count_ngrams([[1, 2, 3], [1, 2, 3]], min_context=2, max_context=2, min_total=1)
    assert set(cols["keys"].tolist()) == {_core.ngram_key([1, 2])}
    # A next token below the confidence floor (count / (total + 1) < 0.3) is not stored.
    cols = ngram.count_ngrams([[1, 2, t] for t in range(10)], min_context=2, max_context=2, min_total=1)
    assert len(cols["keys"]) == 0
    with pytest.raises(ValueError, match="min_total"):
        ngram.count_ngrams([[1, 2, 3]], min_total=0)


def test_a_table_loads_and_bad_files_are_named(tiny_target: str, tmp_path: Path) -> None:
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        good = _table(engine, [[5, 6, 7, 8, 9]] * 3, tmp_path / "good.ngram")
        engine.load_ngram(good)
        assert engine.ngram_path == str(good) and engine.ngram_size == 3 + 2 + 1  # contexts of 2, 3 and 4 tokens
        data = good.read_bytes()
        bad = tmp_path / "bad.ngram"
        cases = {
            "truncated": data[:-9],
            "not an n-gram table": b"GGUF" + data[4:],
            "checksum": data[:60] + bytes([data[60] ^ 1]) + data[61:],
            "format version": data[:8] + struct.pack("<I", 2) + data[12:],
        }
        for what, content in cases.items():
            bad.write_bytes(content)
            with pytest.raises(pyspec.NgramFileError, match=what):
                engine.load_ngram(bad)
            assert engine.ngram_path == str(good), what  # the old table stays
        other = ngram.write_table(tmp_path / "other.ngram", ngram.count_ngrams([[5, 6, 7]], min_total=1),
                                  n_vocab=engine._core.n_vocab, vocab_fingerprint="0123456789abcdef")
        with pytest.raises(pyspec.NgramFileError, match="another vocabulary"):
            engine.load_ngram(other)
        with pytest.raises(FileNotFoundError):
            engine.load_ngram(tmp_path / "missing.ngram")
        assert engine.ngram_path == str(good)
        engine.remove_ngram()
        assert engine.ngram_path is None and engine.ngram_size == 0


def test_kind_corpus_buckets() -> None:
    assert _core.kind_name(_core.kind_corpus(0.97)) == "corpus c0.95"
    assert _core.kind_name(_core.kind_corpus(0.92)) == "corpus c0.9"
    assert _core.kind_name(_core.kind_corpus(0.35)) == "corpus c0.3"
    assert len({_core.kind_corpus(c / 100) for c in range(30, 100)}) == 8


def _replay(engine: pyspec.Engine, prompt: list[int], output: list[int], table: Path | None, **options):
    """auto's drafts over a given output (GenerationConfig options, costs flat and fixed)."""
    params = pyspec.GenerationConfig(method="auto", pool=False, auto_adapt_costs=False, **options).to_core()
    ((sizes, accepted, kinds),) = _core.replay_auto(
        [(prompt, output)], pyspec.CostCurve((1, 64), (10.0, 10.0))._core(), params.lookup, params.pool,
        params.scheduler, corpus=engine._core.load_ngram(str(table)) if table else None)
    assert sum(a + 1 for a in accepted) == len(output)
    return list(sizes), list(accepted), list(kinds)


def test_auto_drafts_what_the_table_predicts(tiny_target: str, tmp_path: Path) -> None:
    """An output the request has never seen but the corpus holds: without the table auto decodes
    it plainly (nothing to copy), with it the corpus chain is drafted and accepted."""
    rng = np.random.default_rng(0)
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        half = engine._core.n_vocab // 2
        output = rng.integers(10, half, size=40).tolist()
        prompt = rng.integers(half, 2 * half, size=8).tolist() + output[:4]
        table = _table(engine, [output] * 12, tmp_path / "corpus.ngram")  # totals >= corpus_min_total (10)
        sizes, accepted, _ = _replay(engine, prompt, output[4:], None)
        assert sum(accepted) == 0
        sizes, accepted, kinds = _replay(engine, prompt, output[4:], table)
        corpus_kinds = {_core.kind_corpus(c / 100) for c in range(30, 100)}
        assert any(k in corpus_kinds for k in kinds)
        assert sum(accepted) >= len(output) // 2 and len(sizes) < len(output) // 2
        # auto_corpus=False leaves the table out.
        sizes, accepted, _ = _replay(engine, prompt, output[4:], table, auto_corpus=False)
        assert sum(accepted) == 0


def test_auto_with_a_table_equals_plain_decoding(tiny_target: str, tmp_path: Path) -> None:
    """Greedy auto with a table built from the target's own outputs: drafts from it are accepted,
    and the output is plain decoding's, token for token."""
    prompts = ["The quick brown fox", "def hello():\n    return", "a b c a b c"]
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as engine:
        engine._core.set_cost(False, pyspec.CostCurve((1, 64), (10.0, 10.0))._core(), "")
        plain = [engine.generate(p, max_tokens=48, method="none") for p in prompts]
        engine.load_ngram(_table(engine, [r.tokens for r in plain] * 12, tmp_path / "own.ngram"))
        gained = 0
        for p, ref in zip(prompts, plain):
            r = engine.generate(p, max_tokens=48, auto_adapt_costs=False, pool=False)
            assert r.tokens == ref.tokens, p
            without = engine.generate(p, max_tokens=48, auto_adapt_costs=False, pool=False, auto_corpus=False)
            assert without.tokens == ref.tokens, p
            gained += r.stats.n_accepted - without.stats.n_accepted
        assert gained > 0  # the table's drafts were accepted where lookup had nothing


def test_build_cli_writes_a_table_from_text_files(tiny_target: str, tmp_path: Path) -> None:
    from pyspec.cli.main import main

    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat. " * 50, encoding="utf-8")
    out = tmp_path / "t.ngram"
    assert main(["ngram", "build", "--target", tiny_target, "--text", str(text), "--out", str(out),
                 "--min-total", "5", "--no-progress"]) == 0
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2, ngram=out) as engine:
        assert engine.ngram_size > 0


def test_bad_corpus_settings_are_named() -> None:
    params = pyspec.GenerationConfig(method="auto").to_core()
    curve = pyspec.CostCurve((1, 64), (10.0, 10.0))._core()
    for field, value in (("corpus_min_total", 0), ("corpus_max_depth", -1)):
        bad = pyspec.GenerationConfig(method="auto").to_core().scheduler
        setattr(bad, field, value)
        with pytest.raises(pyspec.InvalidArgumentError, match=f"auto {field}"):
            _core.replay_auto([([1, 2], [3, 4])], curve, params.lookup, params.pool, bad)


def test_corpus_settings_reach_the_engine(tiny_target: str, tmp_path: Path) -> None:
    """GenerationConfig.auto_corpus_max_depth / auto_corpus_min_total are the engine's: a depth
    of 0 drafts nothing from the table, a min_total above the table's counts neither, and a bad
    value is named by generate."""
    config = pyspec.GenerationConfig(auto_corpus_max_depth=3, auto_corpus_min_total=7).to_core().scheduler
    assert (config.corpus_max_depth, config.corpus_min_total) == (3, 7)
    defaults = _core.AutoParams()
    assert (pyspec.GenerationConfig.auto_corpus_max_depth, pyspec.GenerationConfig.auto_corpus_min_total) == \
        (defaults.corpus_max_depth, defaults.corpus_min_total)
    rng = np.random.default_rng(0)
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        half = engine._core.n_vocab // 2
        output = rng.integers(10, half, size=40).tolist()
        prompt = rng.integers(half, 2 * half, size=8).tolist() + output[:4]
        table = _table(engine, [output] * 12, tmp_path / "corpus.ngram")  # counts 12
        for options, drafts in (({}, True), ({"auto_corpus_max_depth": 0}, False),
                                ({"auto_corpus_min_total": 13}, False), ({"auto_corpus_min_total": 12}, True)):
            _, accepted, _ = _replay(engine, prompt, output[4:], table, **options)
            assert (sum(accepted) > 0) == drafts, options
        with pytest.raises(pyspec.InvalidArgumentError, match="auto corpus_min_total"):
            engine.generate(prompt, max_tokens=4, auto_corpus_min_total=0)


def test_fuzzed_tables_load_or_are_named(tiny_target: str, tmp_path: Path) -> None:
    """Random bytes of a valid table changed, the checksum recomputed so the checks behind it run:
    each file loads or raises NgramFileError, and the engine keeps generating."""
    rng = np.random.default_rng(1)
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        half = engine._core.n_vocab // 2
        seqs = [rng.integers(0, half, size=30).tolist() for _ in range(3)] * 4
        data = bytearray(_table(engine, seqs, tmp_path / "good.ngram").read_bytes())
        body = len(data) - 8
        bad = tmp_path / "fuzzed.ngram"
        outcomes = {"loaded": 0, "refused": 0}
        for _ in range(200):
            fuzzed = bytearray(data[:body])
            for _ in range(int(rng.integers(1, 4))):
                fuzzed[int(rng.integers(0, body))] = int(rng.integers(0, 256))
            bad.write_bytes(bytes(fuzzed) + struct.pack("<Q", _core.fnv1a64(bytes(fuzzed))))
            try:
                engine.load_ngram(bad)
                outcomes["loaded"] += 1
            except pyspec.NgramFileError:
                outcomes["refused"] += 1
        assert outcomes["refused"] > 0 and sum(outcomes.values()) == 200
        assert len(engine.generate("The quick brown fox", max_tokens=8).tokens) == 8
