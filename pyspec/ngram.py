"""Static n-gram tables for method auto's corpus drafter (engine/include/spec/ngram_table.h).

A table maps contexts of 2..4 tokens, seen in a text corpus tokenized with the target's
vocabulary, to the token that most often followed, with how often it did (count) and how often
the context occurred (total). Method auto drafts a chain from it where nothing is copied and
keeps the nodes its running statistics say pay (AutoParams::use_corpus). The default corpus is
the assistant answers of the ShareGPT conversations (`pyspec data list`), none of the benchmark
suites' prompts or answers.

    pyspec ngram build                   # ShareGPT answers -> ~/.cache/pyspec/ngram/sharegpt-<vocab fingerprint>.ngram
    Engine(target, ngram="default")      # that table (built on first use when missing)
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ._core import CORPUS_MIN_CONFIDENCE

log = logging.getLogger("pyspec.ngram")

MAGIC = b"SPECNGRM"
VERSION = 1
MIN_CONTEXT = 2
MAX_CONTEXT = 4
# Entries kept: contexts seen at least this often whose likeliest next token has a confidence
# count / (total + 1) of at least the corpus drafter's floor (kCorpusMinConfidence).
DEFAULT_MIN_TOTAL = 10
DEFAULT_MAX_CHARS = 100_000_000  # of ShareGPT answers: 20.1M tokens, ~1.5 min to build on 2 cores

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def context_keys(tokens: np.ndarray, positions: np.ndarray, n: int) -> np.ndarray:
    """ngram_key of the n tokens before each position (as the engine computes it)."""
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(len(positions), n, dtype=np.uint64))
        for j in range(1, n + 1):
            h = _splitmix64(h ^ tokens[positions - j].astype(np.uint32).astype(np.uint64))
    return h


def count_ngrams(sequences: Iterable[Sequence[int]], *, min_context: int = MIN_CONTEXT, max_context: int = MAX_CONTEXT,
                 min_total: int = DEFAULT_MIN_TOTAL) -> dict[str, np.ndarray]:
    """The table's columns (keys sorted, unique; tokens, counts, totals) from token sequences."""
    if not 1 <= min_context <= max_context <= 16:
        raise ValueError(f"context sizes must satisfy 1 <= min_context <= max_context <= 16, got {min_context}..{max_context}")
    if min_total < 1:
        raise ValueError(f"min_total must be >= 1, got {min_total}")
    parts = []
    for seq in sequences:
        parts.append(np.asarray(seq, dtype=np.int64))
        parts.append(np.array([-1], dtype=np.int64))  # no context crosses a sequence boundary
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(tokens) and tokens.max(initial=-1) >= 2**31:
        raise ValueError("token ids must fit int32")
    columns: list[tuple[np.ndarray, ...]] = []
    for n in range(min_context, max_context + 1):
        pos = np.arange(n, len(tokens))
        ok = tokens[pos] >= 0
        for j in range(1, n + 1):
            ok &= tokens[pos - j] >= 0
        pos = pos[ok]
        if not len(pos):
            continue
        key, nxt = context_keys(tokens, pos, n), tokens[pos]
        order = np.lexsort((nxt, key))
        key, nxt = key[order], nxt[order]
        new_pair = np.ones(len(key), dtype=bool)
        new_pair[1:] = (key[1:] != key[:-1]) | (nxt[1:] != nxt[:-1])
        start = np.flatnonzero(new_pair)
        pair_count = np.diff(np.append(start, len(key)))
        pair_key, pair_next = key[start], nxt[start]
        new_key = np.ones(len(pair_key), dtype=bool)
        new_key[1:] = pair_key[1:] != pair_key[:-1]
        group = np.cumsum(new_key) - 1
        total = np.add.reduceat(pair_count, np.flatnonzero(new_key))
        # The likeliest next token of each context (the smallest id among equals).
        best = np.lexsort((pair_next, -pair_count, group))
        first = np.ones(len(best), dtype=bool)
        first[1:] = group[best][1:] != group[best][:-1]
        best = best[first]
        count = pair_count[best]
        keep = (total >= min_total) & (count / (total + 1.0) >= CORPUS_MIN_CONFIDENCE)
        columns.append((pair_key[best][keep], pair_next[best][keep].astype(np.int32),
                        count[keep].astype(np.uint32), total[keep].astype(np.uint32)))
    if not columns:
        empty = np.zeros(0)
        return {"keys": empty.astype(np.uint64), "tokens": empty.astype(np.int32),
                "counts": empty.astype(np.uint32), "totals": empty.astype(np.uint32)}
    keys = np.concatenate([c[0] for c in columns])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    # Two contexts of different sizes with one key (a 64-bit collision): keep the first.
    unique = np.ones(len(keys), dtype=bool)
    unique[1:] = keys[1:] != keys[:-1]
    order = order[unique]
    return {"keys": keys[unique], "tokens": np.concatenate([c[1] for c in columns])[order],
            "counts": np.concatenate([c[2] for c in columns])[order],
            "totals": np.concatenate([c[3] for c in columns])[order]}


def write_table(path: str | os.PathLike[str], columns: dict[str, np.ndarray], *, n_vocab: int, vocab_fingerprint: str,
                min_context: int = MIN_CONTEXT, max_context: int = MAX_CONTEXT) -> Path:
    """Writes a table file (format in engine/include/spec/ngram_table.h), atomically."""
    fingerprint = vocab_fingerprint.encode("ascii")
    if len(fingerprint) != 16:
        raise ValueError(f"vocab_fingerprint must be 16 hex digits, got {vocab_fingerprint!r}")
    n = len(columns["keys"])
    body = b"".join([
        MAGIC, struct.pack("<IIIIQ", VERSION, n_vocab, min_context, max_context, n), fingerprint,
        np.ascontiguousarray(columns["keys"], dtype="<u8").tobytes(),
        np.ascontiguousarray(columns["tokens"], dtype="<i4").tobytes(),
        np.ascontiguousarray(columns["counts"], dtype="<u4").tobytes(),
        np.ascontiguousarray(columns["totals"], dtype="<u4").tobytes(),
    ])
    from ._core import fnv1a64

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(body + struct.pack("<Q", fnv1a64(body)))
    os.replace(tmp, out)
    return out


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A table file's header: version, n_vocab, context sizes, entries, vocabulary fingerprint
    (what `_core.NgramTable.load` needs to open it without an engine; it checks the rest)."""
    with open(path, "rb") as f:
        data = f.read(48)
    if data[:8] != MAGIC or len(data) < 48:
        raise ValueError(f"{path}: not an n-gram table")
    version, n_vocab, min_context, max_context, n = struct.unpack_from("<IIIIQ", data, 8)
    return {"version": version, "n_vocab": n_vocab, "min_context": min_context, "max_context": max_context,
            "n_entries": n, "vocab_fingerprint": data[32:48].decode("ascii")}


def open_table(path: str | os.PathLike[str]) -> Any:
    """The engine's NgramTable for a file, without a model (for replays and tools)."""
    from ._core import NgramTable

    header = read_header(path)
    return NgramTable.load(os.fspath(path), header["n_vocab"], header["vocab_fingerprint"])


def sharegpt_answers(max_chars: int = DEFAULT_MAX_CHARS, *, progress: bool | None = None) -> Iterator[str]:
    """Assistant turns of the ShareGPT conversations, up to about max_chars characters."""
    from .data import dataset_file, iter_json_array

    path = dataset_file("sharegpt", progress=progress)
    n_chars = 0
    for record in iter_json_array(path):
        for turn in record.get("conversations", []):
            text = turn.get("value")
            if turn.get("from") == "gpt" and isinstance(text, str) and text.strip():
                yield text
                n_chars += len(text)
                if n_chars >= max_chars:
                    return


def default_table_path(engine: Any) -> Path:
    """Where `pyspec ngram build` puts the ShareGPT table for this engine's vocabulary."""
    from .fetch import Cache

    return Cache.default().root / "ngram" / f"sharegpt-{engine.vocab_fingerprint}.ngram"


def build_table(engine: Any, texts: Iterable[str], out: str | os.PathLike[str], *, min_total: int = DEFAULT_MIN_TOTAL,
                progress: bool = True) -> Path:
    """Tokenizes texts with the engine's target vocabulary and writes their table to out."""
    from tqdm import tqdm

    sequences = []
    n_tokens = 0
    with tqdm(desc="tokenizing", unit=" texts", file=sys.stderr, disable=not progress) as bar:
        for text in texts:
            ids = engine.tokenize(text, add_special=False, parse_special=False)
            sequences.append(np.asarray(ids, dtype=np.int32))
            n_tokens += len(ids)
            bar.update(1)
            bar.set_postfix_str(f"{n_tokens / 1e6:.1f}M tokens", refresh=False)
    if progress:
        print(f"counting n-grams of {n_tokens:,} tokens ...", file=sys.stderr)
    columns = count_ngrams(sequences, min_total=min_total)
    path = write_table(out, columns, n_vocab=engine.n_vocab, vocab_fingerprint=engine.vocab_fingerprint)
    log.info("wrote %s: %d entries from %d tokens", path, len(columns["keys"]), n_tokens)
    return path


def ensure_default_table(engine: Any, *, progress: bool = True) -> Path:
    """The default (ShareGPT) table for the engine's vocabulary, built when missing."""
    path = default_table_path(engine)
    if not path.is_file():
        if progress:
            print(f"building the n-gram table {path} from ShareGPT answers (once, about 2 minutes)", file=sys.stderr)
        build_table(engine, sharegpt_answers(progress=progress), path, progress=progress)
    return path
