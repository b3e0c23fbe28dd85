"""Deterministic tiny random-weight GGUF models for tests.

`build_tiny_model` writes a small `llama`-architecture GGUF (f32, ~0.5 MB) that llama.cpp loads,
tokenizes with and generates from. Target/draft pairs share one vocabulary:

- the vocabulary (byte-level BPE tokens, merges, token types, special ids, chat template) depends
  only on `n_merges`, never on the weight seed;
- the weights are a pure function of (seed, base_seed, perturb) and the shape arguments, so the
  same arguments give a byte-identical file;
- `base_seed=B, perturb=p` gives the weights of seed B plus p times independent noise drawn from
  `seed`: a "perturbed copy" draft that agrees with target B often but not always. `perturb=0`
  reproduces model B exactly.
- `arch="qwen2"` writes the same model as a `qwen2` GGUF with q/k/v biases (llama.cpp then uses
  NEOX-style rope); `tied_output=True` leaves out output.weight, so the head is the embedding.
  Both exist for the PyTorch loader's tests (pyspec.online); the defaults give the files above.

Installed as `pyspec._models.tiny`; run as `python -m pyspec._models.tiny OUT.gguf [--seed S]`.
"""

from __future__ import annotations

import argparse
import os
import re
import zlib
from collections import Counter
from pathlib import Path

import gguf
import numpy as np

EOS_TEXT = "<|endoftext|>"
IM_START_TEXT = "<|im_start|>"
IM_END_TEXT = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TEXT, IM_START_TEXT, IM_END_TEXT)
# Fill-in-the-middle markers (build_tiny_model(fim=True)), spelled as Qwen2.5-Coder spells them.
FIM_TOKENS = {"fim_pre": "<|fim_prefix|>", "fim_suf": "<|fim_suffix|>", "fim_mid": "<|fim_middle|>"}

# chatml; llama_chat_apply_template recognises it by the "<|im_start|>" it contains.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

RMS_NORM_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0

# Weight scales, chosen by measurement with llama.cpp 0c1e570 (n_vocab 459, 2 layers, width 64):
# - EMBED_STD vs PROJ_GAIN: the token embedding dominates the residual stream, so the f16 KV
#   cache rounding moves logits by at most ~2e-3 between batched and one-token evaluation
#   (PROJ_GAIN 1.0 gave ~6e-3), while attention still carries enough context that greedy
#   generations do not fall into short loops (0.35 did).
# - QK_GAIN: attention sharp enough to depend on the context.
# - LOGIT_STD: standard deviation of a logit for a unit-RMS final hidden state; 4 gives top-1
#   probabilities of about 0.2-0.85 and a median top-2 gap of ~0.85 (under 0.05 at ~3% of
#   positions).
EMBED_STD = 1.0
QK_GAIN = 2.0           # q and k projections, relative to 1/sqrt(n_embd)
PROJ_GAIN = 0.5         # v, attn_output, ffn_* projections, relative to 1/sqrt(fan_in)
LOGIT_STD = 4.0
BIAS_STD = 0.5          # q, k, v biases of arch="qwen2"

ARCHS = ("llama", "qwen2")

# Text the merges are learned from: English prose and Python code, so that common words,
# indentation and keywords become single tokens. Changing it changes every tiny vocabulary.
MERGE_CORPUS = '''\
The quick brown fox jumps over the lazy dog. There is nothing in the world that the
other one can do better than this, and then they went on to the next thing.
It was the best of times, it was the worst of times; in the end we return to the start.
When the answer is not known, the model should say so and explain what it would need.
Write a function that returns the sum of the numbers in a list, then test it on an example.

def hello():
    return 1

def add(a, b):
    """Return the sum of a and b."""
    return a + b

def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)

class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value

for i in range(10):
    if i % 2 == 0:
        print(i, "is even")
    else:
        print(i, "is odd")

import os
from typing import List

def read_lines(path: str) -> List[str]:
    with open(path) as handle:
        return [line.strip() for line in handle if line.strip()]

result = [x * x for x in range(100) if x % 3 == 0]
assert len(result) == 34, "unexpected length"
while True:
    break
'''

# The pre-tokenizer llama.cpp applies for tokenizer.ggml.pre = "default" (ASCII approximation):
# runs of punctuation first, then the GPT-2 word pattern. Merges only help inside such words.
_PUNCT_RUN = re.compile(r"[!-/:-@\[-_{-~]+")
_GPT2_WORD = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n_extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n_extra)
            n_extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _pre_tokenize(text: str) -> list[str]:
    words: list[str] = []
    position = 0
    for punct in _PUNCT_RUN.finditer(text):
        words.extend(_GPT2_WORD.findall(text[position:punct.start()]))
        words.append(punct.group())
        position = punct.end()
    words.extend(_GPT2_WORD.findall(text[position:]))
    return words


def learn_merges(corpus: str, n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE training: repeatedly merge the most frequent adjacent pair.

    Ties go to the lexicographically smallest pair, so the result is a pure function of the
    arguments. Returns pairs of byte-level symbol strings, in rank order.
    """
    byte_char = _bytes_to_unicode()
    word_counts = Counter(
        tuple(byte_char[b] for b in word.encode("utf-8")) for word in _pre_tokenize(corpus)
    )
    words = sorted(word_counts.items())
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pair_counts: Counter[tuple[str, str]] = Counter()
        for symbols, count in words:
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] += count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merges.append(best)
        merged = best[0] + best[1]
        new_words = []
        for symbols, count in words:
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            new_words.append((tuple(out), count))
        words = new_words
    return merges


def build_vocab(n_merges: int = 200, extra_special: tuple[str, ...] = ()) -> tuple[list[str], list[int], list[str]]:
    """Token texts, token types and merge strings ("a b") of the tiny vocabulary.

    Ids 0..255 are the byte symbols in byte order, then one token per new merged string, then
    the special tokens <|endoftext|>, <|im_start|>, <|im_end|> and `extra_special` (CONTROL).
    """
    byte_char = _bytes_to_unicode()
    tokens = [byte_char[b] for b in range(256)]
    known = set(tokens)
    merges = learn_merges(MERGE_CORPUS, n_merges)
    for left, right in merges:
        if left + right not in known:  # two merges can spell the same string
            known.add(left + right)
            tokens.append(left + right)
    token_types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    tokens.extend(SPECIAL_TOKENS + extra_special)
    token_types.extend([int(gguf.TokenType.CONTROL)] * (len(SPECIAL_TOKENS) + len(extra_special)))
    return tokens, token_types, [f"{left} {right}" for left, right in merges]


def _standard_normal(seed: int, stream: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Normal noise for one tensor: independent per (seed, stream, tensor name).

    Uses the legacy RandomState, whose stream numpy keeps stable across versions.
    """
    key = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, stream, zlib.crc32(name.encode())]
    return np.random.RandomState(key).standard_normal(shape)


def _tensor_specs(
    n_vocab: int, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
    qkv_bias: bool = False, tied_output: bool = False,
) -> list[tuple[str, tuple[int, ...], float | None]]:
    """(name, numpy shape, std) of every tensor, in file order; std None means all ones (norms).

    Numpy shapes are [rows = output dim, cols = input dim]; GGUF stores them reversed.
    """
    head_dim = n_embd // n_head
    n_embd_q = head_dim * n_head
    n_embd_kv = head_dim * n_head_kv
    specs: list[tuple[str, tuple[int, ...], float | None]] = [
        ("token_embd.weight", (n_vocab, n_embd), EMBED_STD),
    ]
    for layer in range(n_layer):
        blk = f"blk.{layer}"
        specs += [
            (f"{blk}.attn_norm.weight", (n_embd,), None),
            (f"{blk}.attn_q.weight", (n_embd_q, n_embd), QK_GAIN / np.sqrt(n_embd)),
            (f"{blk}.attn_k.weight", (n_embd_kv, n_embd), QK_GAIN / np.sqrt(n_embd)),
            (f"{blk}.attn_v.weight", (n_embd_kv, n_embd), PROJ_GAIN / np.sqrt(n_embd)),
            (f"{blk}.attn_output.weight", (n_embd, n_embd_q), PROJ_GAIN / np.sqrt(n_embd_q)),
            (f"{blk}.ffn_norm.weight", (n_embd,), None),
            (f"{blk}.ffn_gate.weight", (n_ff, n_embd), PROJ_GAIN / np.sqrt(n_embd)),
            (f"{blk}.ffn_up.weight", (n_ff, n_embd), PROJ_GAIN / np.sqrt(n_embd)),
            (f"{blk}.ffn_down.weight", (n_embd, n_ff), PROJ_GAIN / np.sqrt(n_ff)),
        ]
        if qkv_bias:
            specs += [
                (f"{blk}.attn_q.bias", (n_embd_q,), BIAS_STD),
                (f"{blk}.attn_k.bias", (n_embd_kv,), BIAS_STD),
                (f"{blk}.attn_v.bias", (n_embd_kv,), BIAS_STD),
            ]
    specs.append(("output_norm.weight", (n_embd,), None))
    if not tied_output:
        specs.append(("output.weight", (n_vocab, n_embd), LOGIT_STD / np.sqrt(n_embd)))
    return specs


def build_tiny_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
    n_merges: int = 200,
    base_seed: int | None = None,
    perturb: float = 0.0,
    arch: str = "llama",
    tied_output: bool = False,
    fim: bool = False,
    eos_gain: float = 0.0,
) -> Path:
    """Write a tiny random `llama` GGUF to `path` and return the path.

    seed:      weight seed (independent models for different seeds).
    base_seed: if set, the weights are those of `base_seed` plus `perturb` * noise from `seed`;
               perturb=0 reproduces the `base_seed` model byte for byte.
    The output rows of the special tokens are zero, so their logit is always 0 and greedy
    decoding never picks them (generation runs until the requested length); with
    tied_output=True those rows are zero in the embedding, which is the output head.
    eos_gain:  > 0 gives <|endoftext|> the random output row drawn for it, times eos_gain, so
               that the model ends its text where that row wins (1: as often as an ordinary
               token). Every other row is unchanged; 0 keeps the file byte-identical to one
               built without it.
    arch:      "llama", or "qwen2" (adds q/k/v biases; llama.cpp uses NEOX rope for it).
    fim:       add fill-in-the-middle marker tokens (FIM_TOKENS) after the special tokens (a
               different vocabulary, hence different weights, from the model without them).
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd={n_embd} must divide by n_head={n_head}, "
                         f"and n_head by n_head_kv={n_head_kv}")
    if eos_gain < 0:
        raise ValueError(f"eos_gain={eos_gain} must be >= 0")
    if perturb < 0 or (perturb > 0 and base_seed is None):
        raise ValueError(f"perturb={perturb} needs perturb >= 0 and a base_seed to perturb")
    path = Path(path)
    extra_special = tuple(FIM_TOKENS.values()) if fim else ()
    tokens, token_types, merges = build_vocab(n_merges, extra_special)
    n_special = len(SPECIAL_TOKENS) + len(extra_special)
    n_vocab = len(tokens)
    eos_id = tokens.index(EOS_TEXT)
    im_end_id = tokens.index(IM_END_TEXT)
    weight_seed = seed if base_seed is None else base_seed

    writer = gguf.GGUFWriter(None, arch)
    writer.add_name("pyspec-tiny")
    if perturb > 0:
        weights = f"seed {base_seed} + {perturb!r} * noise of seed {seed}"
    else:  # described by its weights only, so an identical draft is byte-identical
        weights = f"seed {weight_seed}"
    if eos_gain > 0:
        weights += f", end-of-text row x {eos_gain!r}"
    writer.add_description(f"pyspec tiny random model, weights: {weights}")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(eos_id)
    writer.add_eos_token_id(eos_id)
    writer.add_eot_token_id(im_end_id)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for key, text in FIM_TOKENS.items() if fim else ():
        writer.add_uint32(f"tokenizer.ggml.{key}_token_id", tokens.index(text))

    specs = _tensor_specs(n_vocab, n_layer, n_embd, n_head, n_head_kv, n_ff,
                          qkv_bias=arch == "qwen2", tied_output=tied_output)
    for name, shape, std in specs:
        if std is None:
            writer.add_tensor(name, np.ones(shape, dtype=np.float32))
            continue
        values = _standard_normal(weight_seed, 0, name, shape)
        if perturb > 0:
            values = values + perturb * _standard_normal(seed, 1, name, shape)
        values = (std * values).astype(np.float32)
        if name == ("token_embd.weight" if tied_output else "output.weight"):
            eos_row = values[eos_id] * np.float32(eos_gain)
            values[n_vocab - n_special:] = 0.0
            if eos_gain > 0:
                values[eos_id] = eos_row
        writer.add_tensor(name, values)

    return write_gguf(writer, path)


def write_gguf(writer: gguf.GGUFWriter, path: Path) -> Path:
    """Writes a filled GGUFWriter (made with no path) to `path` beside it and renames, so
    concurrent builders never see a partial file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, path)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="GGUF file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-seed", type=int, default=None)
    parser.add_argument("--perturb", type=float, default=0.0)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--eos-gain", type=float, default=0.0)
    args = parser.parse_args(argv)
    out = build_tiny_model(args.out, seed=args.seed, base_seed=args.base_seed,
                           perturb=args.perturb, n_layer=args.n_layer, n_embd=args.n_embd,
                           eos_gain=args.eos_gain)
    print(out)


if __name__ == "__main__":
    main()
