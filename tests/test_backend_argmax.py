"""Backend argmax (llama.cpp's backend sampling, GenerationConfig.backend_argmax): a greedy request
that needs nothing of a row but its argmax takes it inside the target's graph, and no logits row
reaches the host. It must give the tokens the host argmax gives, for every method, switch on and
off between requests, and stay off where a request reads the rows."""

from __future__ import annotations

import math

import pytest

PROMPTS = ["def hello():\n    return", "The quick brown fox", "import numpy as np\n\nclass Model:"]

METHODS = [
    ("none", {}),
    ("chain", dict(n_draft=4)),
    ("tree", dict(tree_nodes=12, tree_depth=4)),
    ("beam", dict(beams=3, beam_length=4)),
    ("lookup", dict(n_draft=6)),
    ("ouroboros", dict(n_draft=4)),
    ("auto", {}),
]


@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_backend_argmax_gives_the_host_argmax_tokens(engines, method: str, options: dict) -> None:
    engine = engines["perturbed"]
    for prompt in PROMPTS:
        host = engine.generate(prompt, max_tokens=40, method=method, backend_argmax=False, **options)
        device = engine.generate(prompt, max_tokens=40, method=method, backend_argmax=True, **options)
        assert not host.stats.backend_argmax and device.stats.backend_argmax
        assert device.tokens == host.tokens, (method, prompt)


def test_backend_argmax_switches_off_for_requests_that_read_rows(engines) -> None:
    """Requests alternate between argmax-only and row-reading ones; each gets what it asked for."""
    engine = engines["perturbed"]
    plain = engine.generate(PROMPTS[0], max_tokens=24, method="chain", backend_argmax=False)
    for _ in range(2):
        fast = engine.generate(PROMPTS[0], max_tokens=24, method="chain", backend_argmax=True)
        assert fast.stats.backend_argmax and fast.tokens == plain.tokens
        rows = engine.generate(PROMPTS[0], max_tokens=24, method="chain", backend_argmax=True, logprobs=2,
                               return_logits=True, trace_top_k=4)
        assert not rows.stats.backend_argmax and rows.tokens == plain.tokens
        assert rows.logits is not None and rows.logits.shape[0] == len(rows.tokens)
        assert [int(row.argmax()) for row in rows.logits] == list(rows.tokens)
        assert rows.logprobs is not None and len(rows.logprobs.token_logprobs) == len(rows.tokens)
    sampled = engine.generate(PROMPTS[0], max_tokens=24, method="chain", backend_argmax=True, temperature=0.8, seed=3)
    assert not sampled.stats.backend_argmax and len(sampled.tokens) == 24
    grammar = engine.generate(PROMPTS[1], max_tokens=12, method="lookup", backend_argmax=True, grammar='root ::= [a-z ]+')
    assert not grammar.stats.backend_argmax
    penalised = engine.generate(PROMPTS[1], max_tokens=12, method="chain", backend_argmax=True, repetition_penalty=1.3)
    assert not penalised.stats.backend_argmax


def test_backend_argmax_after_evaluate(engines) -> None:
    """evaluate() reads every row: it turns backend argmax off, and the next request on again."""
    engine = engines["identical"]
    first = engine.generate(PROMPTS[2], max_tokens=16, method="chain", backend_argmax=True)
    rows = engine.evaluate(engine.tokenize(PROMPTS[2]), all_rows=True)
    assert rows.shape[0] > 1
    again = engine.generate(PROMPTS[2], max_tokens=16, method="chain", backend_argmax=True)
    assert again.stats.backend_argmax and again.tokens == first.tokens


def test_backend_argmax_defaults_to_the_host_on_the_cpu(engines) -> None:
    """None (the default) takes the argmax on the backend only where the output layer runs on a
    GPU; these engines run on the CPU, so the rows come to the host."""
    if engines["identical"].n_gpu_layers != 0:
        pytest.skip("layers offloaded (PYSPEC_N_GPU_LAYERS): the default then depends on the device")
    r = engines["identical"].generate(PROMPTS[0], max_tokens=8, method="chain")
    assert not r.stats.backend_argmax


def test_trace_records_steps_without_top_k_by_default(engines) -> None:
    engine = engines["independent"]
    r = engine.generate(PROMPTS[1], max_tokens=30, method="chain", n_draft=4)
    t = r.trace
    assert t.n_steps == r.stats.n_target_calls and int(t.n_accepted.sum()) == r.stats.n_accepted
    assert t.reject_steps.shape[0] > 0
    assert t.top_ids.shape == (t.reject_steps.shape[0], 0) and all(math.isnan(p) for p in t.reject_probs)
    k = engine.generate(PROMPTS[1], max_tokens=30, method="chain", n_draft=4, trace_top_k=5)
    assert k.tokens == r.tokens and k.trace.top_ids.shape == (t.reject_steps.shape[0], 5)
    assert all(0.0 <= p <= 1.0 for p in k.trace.reject_probs)


def test_backend_argmax_must_be_a_bool_or_none() -> None:
    from pyspec import GenerationConfig

    with pytest.raises(TypeError, match="backend_argmax must be a bool"):
        GenerationConfig(backend_argmax=1)
