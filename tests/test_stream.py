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
    """Leaving the loop after the first piece cancels the generation. Deterministic: the worker
    runs at most MAX_PENDING + 1 pieces of at most 4 tokens each ahead of the consumer, far fewer
    than max_tokens, so it cannot finish before the cancellation reaches it."""
    engine = engines["perturbed"]
    max_tokens = 200
    assert 4 * (pyspec.TextStream.MAX_PENDING + 2) < max_tokens
    reference = engine.generate("The quick", max_tokens=max_tokens)
    assert len(reference.tokens) == max_tokens  # no end of generation before max_tokens
    stream = engine.stream("The quick", max_tokens=max_tokens)
    for _piece in stream:
        break  # leaving the loop cancels the generation
    assert stream.result is not None
    assert stream.result.finish_reason == "cancelled"
    assert len(stream.result.tokens) < max_tokens
    assert stream.result.tokens == reference.tokens[: len(stream.result.tokens)]
    again = engine.generate("The quick", max_tokens=max_tokens)
    assert again.tokens == reference.tokens


def test_stream_dropped_unread_is_cancelled(engines) -> None:
    """A stream nobody reads or closes does not keep generating (and holding the engine) to the end."""
    import gc

    engine = engines["perturbed"]
    stream = engine.stream("The quick", max_tokens=800)
    worker = stream._thread
    del stream
    gc.collect()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert len(engine.generate("The quick", max_tokens=5).tokens) == 5


def test_engine_call_from_a_stream_reading_thread_raises_instead_of_hanging(engines, tmp_path) -> None:
    """Calling the engine from inside a stream's loop, while the stream's generation holds the
    engine and waits for that loop to read on, would wait forever: it raises EngineBusyError
    (generate, save_stats, close alike) and changes nothing; once the stream is closed the engine
    serves again. A short stream that ends on its own is waited for, not refused."""
    engine = engines["perturbed"]
    reference = engine.generate("The quick", max_tokens=8)
    stream = engine.stream("The quick", max_tokens=400)  # more pieces than the stream's queue holds
    pieces = iter(stream)
    next(pieces)
    with pytest.raises(pyspec.EngineBusyError, match="finish the stream"):
        engine.generate("The quick", max_tokens=8)
    with pytest.raises(pyspec.EngineBusyError):
        engine.save_stats(tmp_path / "stats.json")
    with pytest.raises(pyspec.EngineBusyError):
        engine.close()
    assert not (tmp_path / "stats.json").exists() and not engine.closed
    stream.close()
    assert stream.result is not None and stream.result.finish_reason == "cancelled"
    assert engine.generate("The quick", max_tokens=8).tokens == reference.tokens
    short = engine.stream("The quick", max_tokens=8)  # ends without being read: waited for
    assert engine.generate("The quick", max_tokens=8).tokens == reference.tokens
    assert "".join(short) == reference.text


def test_callback_exception_propagates_and_engine_survives(engines) -> None:
    engine = engines["identical"]

    def boom(piece: str) -> bool:
        raise RuntimeError("stop right there")

    config = GenerationConfig(max_tokens=20, method="chain", n_draft=4, trace_top_k=0)
    with pytest.raises(RuntimeError, match="stop right there"):
        engine._run(engine.tokenize("hello"), config, boom)
    assert len(engine.generate("hello", max_tokens=10).tokens) == 10


def per_byte_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    """The engine's policy for invalid UTF-8: one U+FFFD per byte that starts no valid character."""
    return "\ufffd" * (error.end - error.start), error.end


def test_streamed_pieces_are_valid_text_for_random_bytes(engines) -> None:
    """Random models emit arbitrary bytes, a multi-byte character often split over two tokens.
    The stream holds back an incomplete character until its last byte arrives, so the joined
    pieces equal the whole output decoded at once: a piece boundary inside a character would show
    up as replacement characters where the whole decoding has the character."""
    import codecs

    codecs.register_error("pyspec_per_byte", per_byte_replace)
    engine = engines["independent"]
    stream = engine.stream("\u00e9\u4e2d", max_tokens=120, temperature=1.0, seed=12)
    pieces = list(stream)
    raw = b"".join(engine._core.token_to_piece(t) for t in stream.result.tokens)
    whole = raw.decode("utf-8", errors="pyspec_per_byte")
    assert "".join(pieces) == whole == stream.result.text
    # The output must contain a character whose bytes came from two tokens, or this proves nothing.
    boundaries, offset = set(), 0
    for t in stream.result.tokens:
        offset += len(engine._core.token_to_piece(t))
        boundaries.add(offset)
    n_split, offset = 0, 0
    for c in whole:
        n_bytes = 1 if c == "\ufffd" else len(c.encode("utf-8"))
        n_split += any(offset < b < offset + n_bytes for b in boundaries)
        offset += n_bytes
    assert offset == len(raw)
    assert n_split > 0


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
