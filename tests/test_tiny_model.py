"""The tiny random GGUF builder: determinism, shared vocabulary, identical and perturbed drafts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from pyspec._models.tiny import build_tiny_model

# Everything that decides how text maps to token ids and back; must not depend on the seed.
VOCAB_KEYS = (
    "llama.vocab_size",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)


def vocab_metadata(path: Path) -> dict[str, object]:
    fields = GGUFReader(path).fields
    return {key: fields[key].contents() for key in VOCAB_KEYS}


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in GGUFReader(path).tensors}


def test_same_arguments_give_identical_bytes(tmp_path: Path) -> None:
    for kwargs in (dict(seed=3), dict(seed=5, base_seed=3, perturb=0.1)):
        first = build_tiny_model(tmp_path / "a.gguf", **kwargs).read_bytes()
        second = build_tiny_model(tmp_path / "b.gguf", **kwargs).read_bytes()
        assert first == second
        assert len(first) < 2_000_000


def test_vocabulary_does_not_depend_on_weights(tmp_path: Path) -> None:
    base = vocab_metadata(build_tiny_model(tmp_path / "s0.gguf", seed=0))
    assert base["tokenizer.ggml.model"] == "gpt2"
    assert base["tokenizer.ggml.pre"] == "default"
    assert base["tokenizer.ggml.add_bos_token"] is False
    tokens = base["tokenizer.ggml.tokens"]
    assert len(tokens) == base["llama.vocab_size"] > 256 + 100
    assert len(set(tokens)) == len(tokens)
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert base["tokenizer.ggml.token_type"][-3:] == [3, 3, 3]  # CONTROL
    assert base["tokenizer.ggml.eos_token_id"] == len(tokens) - 3
    assert "<|im_start|>" in base["tokenizer.chat_template"]

    for name, kwargs in {
        "s1": dict(seed=1),
        "s7": dict(seed=7, n_layer=1, n_embd=32),
        "perturbed": dict(seed=2, base_seed=0, perturb=0.3),
    }.items():
        assert vocab_metadata(build_tiny_model(tmp_path / f"{name}.gguf", **kwargs)) == base


def test_seeds_give_different_weights(tmp_path: Path) -> None:
    a = tensors(build_tiny_model(tmp_path / "s0.gguf", seed=0))
    b = tensors(build_tiny_model(tmp_path / "s1.gguf", seed=1))
    assert a.keys() == b.keys()
    assert not np.array_equal(a["output.weight"], b["output.weight"])
    assert not np.array_equal(a["blk.1.attn_q.weight"], b["blk.1.attn_q.weight"])


def test_zero_perturbation_reproduces_the_base_model(tmp_path: Path) -> None:
    base_path = build_tiny_model(tmp_path / "base.gguf", seed=4)
    copy_path = build_tiny_model(tmp_path / "copy.gguf", seed=9, base_seed=4, perturb=0.0)
    base, copy = tensors(base_path), tensors(copy_path)
    assert base.keys() == copy.keys()
    for name in base:
        assert np.array_equal(base[name], copy[name]), name
    assert base_path.read_bytes() == copy_path.read_bytes()


def test_perturbation_is_small_relative_noise(tmp_path: Path) -> None:
    base = tensors(build_tiny_model(tmp_path / "base.gguf", seed=4))
    for perturb in (0.1, 0.3):
        draft = tensors(build_tiny_model(tmp_path / "d.gguf", seed=9, base_seed=4, perturb=perturb))
        for name in ("token_embd.weight", "blk.0.attn_k.weight", "blk.1.ffn_down.weight"):
            relative = np.std(draft[name] - base[name]) / np.std(base[name])
            assert relative == pytest.approx(perturb, rel=0.1), name
        # norms are not random, so they stay equal
        assert np.array_equal(draft["output_norm.weight"], base["output_norm.weight"])


def test_perturb_needs_a_base_seed(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        build_tiny_model(tmp_path / "x.gguf", seed=1, perturb=0.1)


def test_llama_cpp_loads_tokenizes_and_generates(tmp_path: Path) -> None:
    import llama_cpp

    path = build_tiny_model(tmp_path / "tiny.gguf", seed=0)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False)

    text = b"def hello():\n    return 1"
    ids = llm.tokenize(text, add_bos=False)
    assert len(ids) < len(text)  # merges apply
    assert llm.detokenize(ids) == text

    llm.eval(ids)
    generated = []
    for _ in range(40):
        next_id = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        generated.append(next_id)
        llm.eval([next_id])
    assert len(set(generated)) > 10
    assert llm.n_vocab() - 3 not in generated  # special rows of the output head are zero
