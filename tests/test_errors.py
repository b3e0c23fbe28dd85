"""Bad input gets a clear Python exception naming what is wrong, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_edit import copy_with_duplicated_token

import pyspec
from pyspec._models.tiny import build_tiny_model


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        pyspec.Engine(str(tmp_path / "nope.gguf"))


def test_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello, not a model")
    with pytest.raises(pyspec.ModelLoadError, match="not a GGUF file"):
        pyspec.Engine(str(bad))


def truncated_copy(path: str, tmp_path: Path) -> Path:
    """The first half of a GGUF file: the header parses, the tensor data runs past the end."""
    data = Path(path).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    return cut


def test_truncated_gguf(tmp_path: Path, tiny_target: str) -> None:
    with pytest.raises(pyspec.ModelLoadError, match="could not load model"):
        pyspec.Engine(str(truncated_copy(tiny_target, tmp_path)))


def test_vocab_mismatch_names_difference(tmp_path: Path, tiny_target: str) -> None:
    other = build_tiny_model(tmp_path / "other_vocab.gguf", seed=0, n_merges=150)
    with pytest.raises(pyspec.VocabMismatchError, match="vocabulary sizes differ"):
        pyspec.Engine(tiny_target, draft=str(other))


def test_vocab_mismatch_same_size_names_first_token(tmp_path: Path, tiny_target: str) -> None:
    """Same size, one token text changed: the error names the token id."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(tiny_target)
    field = reader.fields["tokenizer.ggml.tokens"]
    # Rewrite token 300's text in place (same length keeps the file layout valid).
    part = field.parts[field.data[300]]
    assert part.dtype == np.uint8 and len(part) >= 2
    data = bytearray(Path(tiny_target).read_bytes())
    offset = part.ctypes.data - reader.data.ctypes.data
    original = bytes(data[offset : offset + len(part)])
    data[offset : offset + len(part)] = b"Z" * len(part)
    assert bytes(data[offset : offset + len(part)]) != original
    changed = tmp_path / "changed.gguf"
    changed.write_bytes(bytes(data))
    with pytest.raises(pyspec.VocabMismatchError, match="token 300 differs"):
        pyspec.Engine(tiny_target, draft=str(changed))


def test_duplicated_token_text_is_refused_before_llama_cpp(tmp_path: Path, tiny_target: str) -> None:
    """llama.cpp aborts the process on a vocabulary with two equal token texts (fuzz gguf case 20,
    seed 1); the engine's pre-check refuses the file with an error naming both ids."""
    duplicated = tmp_path / "duplicated_token.gguf"
    first, second = copy_with_duplicated_token(tiny_target, duplicated)
    with pytest.raises(pyspec.ModelLoadError, match=f"tokens {first} and {second} are both"):
        pyspec.Engine(str(duplicated), n_ctx=256, n_threads=1)
    with pytest.raises(pyspec.ModelLoadError, match=f"tokens {first} and {second} are both"):
        pyspec.Engine(tiny_target, draft=str(duplicated), n_ctx=256, n_threads=1)


@pytest.mark.parametrize("n_ctx", [2**24 + 1, 2**31 - 1])
def test_context_window_above_the_cap_is_refused(tiny_target: str, n_ctx: int) -> None:
    """Refused by value before llama.cpp sizes anything (2**31 - 1 used to need a 24 GiB vector)."""
    with pytest.raises(pyspec.InvalidArgumentError, match=f"n_ctx={n_ctx} exceeds the largest context window, 16777216"):
        pyspec.Engine(tiny_target, n_ctx=n_ctx, n_threads=1)


def test_trained_context_above_the_cap_is_refused_for_n_ctx_0(tmp_path: Path) -> None:
    """n_ctx=0 takes the file's trained context, so a file claiming 2**24 + 1 tokens is refused too."""
    model = build_tiny_model(tmp_path / "long_context.gguf", seed=0, n_ctx_train=2**24 + 1)
    with pytest.raises(pyspec.InvalidArgumentError, match="trained context, 16777217 tokens"):
        pyspec.Engine(str(model), n_ctx=0, n_threads=1)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=1.5), "top_p"),
        (dict(temperature=1.0, min_p=1.5), "min_p"),
        (dict(top_k=-2), "top_k"),
        (dict(method="chain", n_draft=0), "n_draft"),
        (dict(method="chain", n_draft=100000), "n_draft"),
        (dict(max_tokens=-1), "max_tokens"),
        (dict(method="warp"), "unknown method"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_invalid_generation_arguments(engines, kwargs: dict, match: str) -> None:
    with pytest.raises(pyspec.InvalidArgumentError, match=match):
        engines["identical"].generate("hello", **kwargs)


def test_chain_without_draft(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, n_ctx=256) as engine:
        with pytest.raises(pyspec.InvalidArgumentError, match="needs a draft model"):
            engine.generate("hello", method="chain")
        assert engine.generate("hello", max_tokens=3).finish_reason == "length"  # default: none


def test_every_registered_method_is_named_and_checked(tiny_target: str) -> None:
    """The engine's method table is the one list: the unknown-method error names every entry,
    and every method that requires a draft model refuses to run without one."""
    methods = pyspec._core.drafter_methods()
    names = [name for name, _, _ in methods]
    assert names == list(pyspec.METHODS) and names[0] == "auto" and "none" in names
    with pyspec.Engine(tiny_target, n_ctx=256) as engine:
        with pytest.raises(pyspec.InvalidArgumentError) as info:
            engine.generate("hello", method="warp")
        assert f"available: {', '.join(names)})" in str(info.value)
        for name, use, needs_head in methods:
            if use == "required":
                with pytest.raises(pyspec.InvalidArgumentError, match=f"method '{name}' needs a draft model"):
                    engine.generate("hello", method=name, max_tokens=2)
            elif needs_head:
                with pytest.raises(pyspec.InvalidArgumentError, match=f"method '{name}' needs a draft head"):
                    engine.generate("hello", method=name, max_tokens=2)
            else:
                assert engine.generate("hello", method=name, max_tokens=2).finish_reason == "length"


def test_empty_prompt(engines) -> None:
    with pytest.raises(pyspec.InvalidArgumentError, match="empty"):
        engines["identical"].generate("")


def test_prompt_longer_than_context(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, draft=tiny_target, n_ctx=64) as engine:
        with pytest.raises(pyspec.ContextOverflowError, match="context window"):
            engine.generate("word " * 600)
        # The engine is still usable afterwards.
        assert len(engine.generate("hi", max_tokens=4).tokens) == 4


def test_generation_reaching_the_window_ends_with_length(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, draft=tiny_target, n_ctx=64) as engine:
        prompt = engine.tokenize("def f():")
        r = engine.generate(prompt, max_tokens=1000, method="chain", n_draft=8)
        assert r.finish_reason == "length"
        # llama.cpp rounds n_ctx up (to 256). A full window of n_ctx tokens still predicts one more.
        assert len(prompt) + len(r.tokens) == engine.n_ctx + 1
        plain = engine.generate(prompt, max_tokens=1000, method="none")
        assert plain.tokens == r.tokens


def test_use_after_close(tiny_target: str) -> None:
    engine = pyspec.Engine(tiny_target, n_ctx=128)
    engine.close()
    assert engine.closed
    with pytest.raises(pyspec.EngineClosedError):
        engine.generate("hello")
    with pytest.raises(pyspec.EngineClosedError):
        engine.tokenize("hello")


def test_bad_prompt_type(engines) -> None:
    with pytest.raises(TypeError):
        engines["identical"].generate(3.5)  # type: ignore[arg-type]
    with pytest.raises(pyspec.InvalidArgumentError, match="outside the vocabulary"):
        engines["identical"].generate([1, 2, 10**7])


def test_load_error_quotes_llama_reason_after_llama_cpp_import(tmp_path: Path, tiny_target: str) -> None:
    """Importing llama_cpp installs its own log callback; the engine takes the log back on load."""
    import llama_cpp  # noqa: F401

    with pytest.raises(pyspec.ModelLoadError, match="not within the file bounds"):
        pyspec.Engine(str(truncated_copy(tiny_target, tmp_path)))


def test_n_gpu_layers_defaults_to_the_environment(tiny_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # None (the default) reads $PYSPEC_N_GPU_LAYERS; an explicit value wins; unset means 0.
    monkeypatch.setenv("PYSPEC_N_GPU_LAYERS", "7")
    with pyspec.Engine(tiny_target, n_ctx=128) as engine:
        assert engine.n_gpu_layers == 7
    with pyspec.Engine(tiny_target, n_ctx=128, n_gpu_layers=0) as engine:
        assert engine.n_gpu_layers == 0
    monkeypatch.delenv("PYSPEC_N_GPU_LAYERS")
    with pyspec.Engine(tiny_target, n_ctx=128) as engine:
        assert engine.n_gpu_layers == 0


def test_bad_n_gpu_layers_environment_is_named(tiny_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPEC_N_GPU_LAYERS", "all")
    with pytest.raises(pyspec.InvalidArgumentError, match="PYSPEC_N_GPU_LAYERS='all'"):
        pyspec.Engine(tiny_target, n_ctx=128)
