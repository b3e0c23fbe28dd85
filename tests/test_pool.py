"""The engine's phrase pool (Ouroboros): "lookup" (prompt lookup + pool branches) and
"ouroboros" (draft model phrase by phrase + pool lengthening) on the tiny models: greedy
identity, history reuse across requests, save / load / clear, concurrency, errors."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_greedy import PROMPTS

import pyspec
from pyspec import InvalidArgumentError, PoolFileError

# HumanEval-style prompts: a signature and a docstring each, similar but not equal.
STREAM = [
    f'def {name}(values: list[int], k: int) -> int:\n    """Return the {what} of the first k values."""\n'
    for name, what in [
        ("sum_first", "sum"), ("max_first", "largest"), ("min_first", "smallest"), ("count_even", "number of even"),
        ("product_first", "product"), ("mean_first", "mean"), ("last_of", "last"), ("first_odd", "first odd"),
        ("span_first", "range"), ("count_odd", "number of odd"), ("sum_squares", "sum of squares"),
        ("max_gap", "largest gap"), ("min_gap", "smallest gap"), ("count_pos", "number of positive"),
        ("count_neg", "number of negative"), ("median_first", "median"), ("mode_first", "most common"),
        ("sum_abs", "sum of absolute"), ("xor_first", "xor"), ("or_first", "bitwise or"),
    ]
]


@pytest.fixture()
def engine(tiny_target: str, tiny_drafts: dict[str, str]):
    """A fresh engine per test: the pool starts empty."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.mark.parametrize("kind", ["identical", "independent", "perturbed"])
@pytest.mark.parametrize("method,options", [
    ("lookup", {}), ("lookup", dict(pool=False)), ("lookup", dict(pool_branches=6, pool_max_nodes=40)),
    ("ouroboros", {}), ("ouroboros", dict(n_draft=8, pool_branches=4)), ("ouroboros", dict(pool=False)),
])
def test_pool_methods_greedy_equal_plain(engines, kind: str, method: str, options: dict) -> None:
    engine = engines[kind]
    for _ in range(2):  # the second pass runs with a pool that holds the first pass's phrases
        for prompt in PROMPTS:
            plain = engine.generate(prompt, max_tokens=48, method="none")
            spec = engine.generate(prompt, max_tokens=48, method=method, **options)
            assert spec.tokens == plain.tokens, (kind, method, options, prompt)


def test_history_reuse_raises_tokens_per_call(engine) -> None:
    """Same 20 prompts, same seed: a pool kept across requests beats one cleared before each."""
    def run(clear_each: bool) -> float:
        engine.clear_pool()
        generated = calls = 0
        for prompt in STREAM:
            if clear_each:
                engine.clear_pool()
            r = engine.generate(prompt, max_tokens=48, method="lookup", seed=0)
            generated += r.stats.n_generated
            calls += r.stats.n_target_calls
        return generated / calls

    cold = run(clear_each=True)
    warm = run(clear_each=False)
    assert warm > cold * 1.1, (warm, cold)
    stats = engine.pool_stats()
    assert stats["n_tokens_accepted"] > 0 and stats["n_proven"] > 0
    assert stats["n_inserted_by_source"]["generated"] > 0
    assert stats["n_inserted_by_source"]["prompt"] > 0


def test_ouroboros_drafts_phrases_in_fewer_draft_decodes(engine) -> None:
    """With a warm pool the draft model checks pool phrases in its own decodes: fewer draft
    decodes per drafted token than token-by-token chain drafting."""
    for prompt in STREAM[:5]:
        engine.generate(prompt, max_tokens=48, method="lookup")  # fill the pool
    chain = ouro = 0.0
    for prompt in STREAM[:5]:
        c = engine.generate(prompt, max_tokens=48, method="chain", n_draft=4).stats
        o = engine.generate(prompt, max_tokens=48, method="ouroboros", n_draft=4, pool_branches=0).stats
        chain += c.n_draft_decodes / max(c.n_generated, 1)
        ouro += o.n_draft_decodes / max(o.n_generated, 1)
    assert ouro < chain


def test_verification_harvest(engine) -> None:
    engine.generate(PROMPTS[0], max_tokens=64, method="ouroboros")
    assert engine.pool_stats()["n_inserted_by_source"]["verification"] > 0
    engine.clear_pool()
    engine.generate(PROMPTS[0], max_tokens=64, method="ouroboros", harvest_verification=False,
                    harvest_generated=False, harvest_prompt=False)
    assert engine.pool_stats()["size"] == 0


def test_save_load_round_trip(engine, tmp_path: Path) -> None:
    for prompt in STREAM[:6]:
        engine.generate(prompt, max_tokens=40, method="lookup")
    before = engine.pool_stats()
    path = tmp_path / "pool.bin"
    engine.save_pool(path)
    # Crediting phrases reorders the pool, so the reference runs on the state that was saved.
    reference = engine.generate(STREAM[6], max_tokens=40, method="lookup", harvest_generated=False,
                                harvest_prompt=False, harvest_verification=False)
    engine.clear_pool()
    assert engine.pool_stats()["size"] == 0
    engine.load_pool(path)
    assert engine.pool_stats()["size"] == before["size"]
    again = engine.generate(STREAM[6], max_tokens=40, method="lookup", harvest_generated=False,
                            harvest_prompt=False, harvest_verification=False)
    # The same phrases in the same order give the same drafts: identical step statistics.
    assert again.tokens == reference.tokens
    assert again.stats.n_target_calls == reference.stats.n_target_calls
    assert again.stats.n_drafted == reference.stats.n_drafted


def test_bad_pool_file_keeps_pool(engine, tmp_path: Path) -> None:
    engine.generate(STREAM[0], max_tokens=30, method="lookup")
    size = engine.pool_stats()["size"]
    assert size > 0
    good = tmp_path / "good.bin"
    engine.save_pool(good)
    data = good.read_bytes()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(PoolFileError):
        engine.load_pool(bad)
    with pytest.raises(PoolFileError):
        engine.load_pool(tmp_path / "missing.bin")
    bad.write_bytes(b"not a pool file at all, just text")
    with pytest.raises(PoolFileError):
        engine.load_pool(bad)
    assert engine.pool_stats()["size"] == size


def test_pool_usable_while_generating(engine, tmp_path: Path) -> None:
    """Stats and save from another thread while generations fill the pool."""
    errors: list[BaseException] = []
    done = threading.Event()

    def generate() -> None:
        try:
            for prompt in STREAM[:8]:
                engine.generate(prompt, max_tokens=40, method="lookup")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=generate)
    worker.start()
    n_saves = 0
    while not done.is_set():
        engine.pool_stats()
        engine.save_pool(tmp_path / f"p{n_saves % 2}.bin")
        n_saves += 1
    worker.join()
    assert not errors
    assert n_saves > 0
    engine.load_pool(tmp_path / "p0.bin")


@pytest.mark.parametrize("options,message", [
    (dict(method="lookup", pool_branches=-1), r"n_branches must be in \[0, 62\]"),
    (dict(method="lookup", pool_phrase_len=1), "phrase_len must be in"),
    (dict(method="ouroboros", pool_max_nodes=0), "max_nodes must be in"),
    (dict(method="ouroboros", n_draft=0), "n_draft must be in"),
])
def test_bad_pool_options_are_named(engines, options: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        engines["perturbed"].generate("hello", max_tokens=4, **options)


def test_ouroboros_needs_a_draft(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        with pytest.raises(InvalidArgumentError, match="method 'ouroboros' needs a draft model"):
            engine.generate("hi", max_tokens=4, method="ouroboros")
        assert len(engine.generate("hi", max_tokens=4, method="lookup").tokens) == 4


def test_pool_capacity_bounds_the_pool(engine, tiny_target: str, tmp_path: Path) -> None:
    """Engine(pool_capacity=N) keeps at most N phrases, also when loading a larger pool file."""
    assert engine.pool_stats()["capacity"] == 65536  # the default
    for prompt in STREAM[:4]:
        engine.generate(prompt, max_tokens=40, method="lookup")
    full = engine.pool_stats()["size"]
    assert full > 40
    engine.save_pool(tmp_path / "pool.bin")
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, pool_capacity=20) as small:
        for prompt in STREAM[:4]:
            small.generate(prompt, max_tokens=40, method="lookup")
        stats = small.pool_stats()
        assert stats["capacity"] == 20 and stats["size"] == 20 and stats["n_evicted"] > 0
        small.clear_pool()
        small.load_pool(tmp_path / "pool.bin")
        assert small.pool_stats()["size"] == 20
        assert small.pool_stats()["memory_bytes"] < engine.pool_stats()["memory_bytes"]
    for bad in (0, -1, 2.5, True, (1 << 24) + 1):
        with pytest.raises(InvalidArgumentError, match="capacity"):
            pyspec.Engine(tiny_target, n_ctx=256, n_threads=1, pool_capacity=bad)
