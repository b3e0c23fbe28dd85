"""Streaming, stop strings, cancellation, chat template, tokenizer round trip."""

from __future__ import annotations

import pytest

from pyspec import GenerationConfig

import pyspec


@pytest.mark.parametrize("method", ["none", "chain"])
def test_stream_equals_generate(engines, method: str) -> None:
    engine = engines["perturbed"]
    full = engine.generate("def hello():", max_tokens=60, method=method)
    stream = engine.stream("def hello():", max_tokens=60, method=method)
    pieces = list(stream)
    assert stream.result is not None
    assert "".join(pieces) == full.text == stream.result.text
    assert stream.result.tokens == full.tokens


def test_stream_sampling_equals_generate_with_seed(engines) -> None:
    engine = engines["perturbed"]
    kw = dict(max_tokens=40, temperature=1.0, seed=5)
    full = engine.generate("abc", **kw)
    stream = engine.stream("abc", **kw)
    assert "".join(stream) == full.text


def test_stop_string_cuts_text_and_stream(engines) -> None:
    engine = engines["identical"]
    full = engine.generate("def hello():", max_tokens=60, method="none")
    # Take a stop string from the middle of the text so it certainly occurs.
    stop = full.text[20:24]
    cut = full.text.index(stop)
    r = engine.generate("def hello():", max_tokens=60, stop=[stop])
    assert r.finish_reason == "stop"
    assert r.text == full.text[:cut]
    stream = engine.stream("def hello():", max_tokens=60, stop=[stop])
    assert "".join(stream) == r.text


def test_cancel_from_stream_leaves_engine_usable(engines) -> None:
    engine = engines["perturbed"]
    reference = engine.generate("The quick", max_tokens=50)
    stream = engine.stream("The quick", max_tokens=50)
    for _piece in stream:
        break  # leaving the loop cancels the generation
    assert stream.result is not None
    assert stream.result.finish_reason == "cancelled"
    assert len(stream.result.tokens) < 50
    again = engine.generate("The quick", max_tokens=50)
    assert again.tokens == reference.tokens


def test_callback_exception_propagates_and_engine_survives(engines) -> None:
    engine = engines["identical"]

    def boom(piece: str) -> bool:
        raise RuntimeError("stop right there")

    config = GenerationConfig(max_tokens=20, method="chain", n_draft=4, trace_top_k=0)
    with pytest.raises(RuntimeError, match="stop right there"):
        engine._run(engine.tokenize("hello"), config, boom)
    assert len(engine.generate("hello", max_tokens=10).tokens) == 10


def test_streamed_pieces_are_valid_text_for_random_bytes(engines) -> None:
    """Random models emit arbitrary bytes; the stream never splits a UTF-8 character."""
    engine = engines["independent"]
    stream = engine.stream("\u00e9\u4e2d", max_tokens=120, temperature=1.0, seed=11)
    pieces = list(stream)
    for p in pieces:
        p.encode("utf-8")  # str pieces are valid by construction; no lone surrogates
    assert "".join(pieces) == stream.result.text


def test_chat_template_and_tokenizer(engines) -> None:
    engine = engines["identical"]
    text = engine.apply_chat_template([{"role": "user", "content": "hi there"}])
    assert "<|im_start|>user\nhi there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    tokens = engine.tokenize(text)
    assert 457 in tokens  # <|im_start|> parsed as the special token
    r = engine.generate([{"role": "user", "content": "hi there"}], max_tokens=5)
    assert r.prompt_tokens == tokens
    s = "def hello():\n    return 1"
    assert engine.detokenize(engine.tokenize(s)) == s


def test_engine_is_a_context_manager(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, n_ctx=128) as engine:
        assert not engine.closed
    assert engine.closed


def test_concurrent_callers_are_serialised(engines) -> None:
    """Two threads sharing one engine get the same outputs as sequential calls."""
    import threading

    engine = engines["perturbed"]
    prompts = ["def a():", "The quick brown", "import os", "x = 1"]
    expected = [engine.generate(p, max_tokens=24).tokens for p in prompts]
    got: dict[int, list[int]] = {}

    def work(i: int) -> None:
        got[i] = engine.generate(prompts[i], max_tokens=24).tokens

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(prompts))] == expected
