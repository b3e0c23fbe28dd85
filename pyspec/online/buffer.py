"""Training data from generations: what the target wanted where (OSD's replay buffer).

A `TraceSample` is one generation reduced to what distillation needs: the token sequence and, at
chosen positions, the target's top-k distribution of the next token. `samples_from_result` builds
one from a GenerationResult:

- positions="rejected" (OSD Algorithm 1): the positions where the target rejected a draft token,
  with the top-k the engine recorded there (`result.trace`, temperature 1, k = trace_top_k), and
  the rejected draft token with the target's probability of it as one more entry when it is not
  among them (the loss must push the draft off it; losses.py);
- positions="all": every generated position, with the top-k of the target's logits row behind
  each token (`result.logits`, i.e. the request ran with return_logits=True) or, when the caller
  passes them, rows computed afterwards (`Engine.evaluate(all_rows=True)`).

`prompt_sample` builds the same from the target's rows over a prompt, and `merge_samples` joins
it to the generation's (DistillConfig.prompt_positions).

Numpy only; the trainer turns samples into tensors.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..results import GenerationResult

POSITIONS = ("rejected", "all")


@dataclass(frozen=True, eq=False)
class TraceSample:
    """One generation's training positions. Row r of the student's logits over tokens[: r + 1]
    predicts tokens[r + 1]; the target's distribution there is (top_ids[i], top_probs[i]),
    probabilities over the whole vocabulary (the rest of the mass is the loss's tail bucket)."""

    tokens: np.ndarray     # [n_tokens] int32: prompt + generated tokens, up to the last row + 1
    rows: np.ndarray       # [n_rows] int32: sorted indices into tokens, each < n_tokens
    # [n_rows, k] int32: the target's k likeliest next tokens at each row (positions="rejected":
    # then one more column, the rejected draft token where it is not among them); -1 pads
    top_ids: np.ndarray
    top_probs: np.ndarray  # [n_rows, k] float32: their probabilities (temperature 1; sum <= 1)
    request: int = 0       # index of the request in the stream that produced it (for max_age)
    domain: str = ""
    # [n_rows, n_hidden] float16 or None: for drafters that read the target's hidden state (a
    # draft head), the target's hidden state of row r - 1 for each row r (the row that chose
    # tokens[r]), what the drafter would draft tokens[r + 1] from
    hidden: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])


def top_k_of_logits(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids ([n, k] int32, likeliest first) and softmax probabilities ([n, k] float32) of
    logits rows [n, n_vocab], the softmax taken over the whole vocabulary (in float32, one row
    at a time: no [n, n_vocab] temporaries besides the input)."""
    logits = np.asarray(logits, dtype=np.float32)
    k = min(k, logits.shape[1])
    ids = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(logits, ids, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    ids, top = np.take_along_axis(ids, order, axis=1), np.take_along_axis(top, order, axis=1)
    log_z = np.empty((logits.shape[0], 1), dtype=np.float32)
    scratch = np.empty(logits.shape[1], dtype=np.float32)
    for i, row in enumerate(logits):
        np.subtract(row, top[i, 0], out=scratch)  # top[i, 0] is the row's maximum
        np.exp(scratch, out=scratch)
        log_z[i, 0] = top[i, 0] + np.log(scratch.sum(dtype=np.float32))
    return ids.astype(np.int32), np.exp(top - log_z).astype(np.float32)


def samples_from_result(result: GenerationResult, *, positions: str = "rejected", top_k: int = 32,
                        teacher_logits: np.ndarray | None = None, request: int = 0,
                        domain: str = "") -> TraceSample | None:
    """The training positions of one generation, or None when it has none.

    positions="rejected": the trace's rejections, with the target's top-k the generation recorded
    there (trace_top_k > 0; ValueError when it recorded none). positions="all": every generated token, with
    the target's rows from `teacher_logits` ([n_generated, n_vocab], row i = the target's logits
    before generated token i) or else `result.logits`; ValueError when neither is there.
    """
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
    if positions == "all":
        logits = teacher_logits if teacher_logits is not None else result.logits
        if logits is None:
            raise ValueError("positions='all' needs the target's rows: generate with return_logits=True "
                             "or pass teacher_logits (Engine.evaluate(all_rows=True))")
        return sample_from_rows(result.prompt_tokens, result.tokens, logits, top_k=top_k, request=request,
                                domain=domain)
    trace = result.trace
    if trace.reject_positions.shape[0] == 0:
        return None
    if trace.top_ids.shape[1] == 0:
        raise ValueError("positions='rejected' learns from the target's top-k at each rejection, which this "
                         "generation did not record: generate with trace_top_k > 0 (e.g. 32)")
    rows = len(result.prompt_tokens) - 1 + trace.reject_positions.astype(np.int32)
    top_ids, top_probs = trace.top_ids, trace.top_probs  # padded with -1 where k > n_vocab
    inside = (top_ids == trace.reject_tokens[:, None]).any(axis=1)
    top_ids = np.concatenate([top_ids, np.where(inside, -1, trace.reject_tokens)[:, None]], axis=1)
    top_probs = np.concatenate([top_probs, np.where(inside, 0.0, trace.reject_probs)[:, None]], axis=1)
    return _sample(list(result.prompt_tokens) + list(result.tokens), rows, top_ids, top_probs, request, domain)


def sample_from_rows(prompt_tokens: Sequence[int], tokens: Sequence[int], logits: np.ndarray, *,
                     top_k: int = 32, request: int = 0, domain: str = "") -> TraceSample | None:
    """Every position of a continuation `tokens` of `prompt_tokens`, with the target's logits
    rows before each token ([len(tokens), n_vocab]); None when `tokens` is empty."""
    if logits.shape[0] != len(tokens):
        raise ValueError(f"teacher rows [{logits.shape[0]}, ...] do not match the {len(tokens)} generated tokens")
    if not tokens:
        return None
    rows = len(prompt_tokens) - 1 + np.arange(len(tokens), dtype=np.int32)
    top_ids, top_probs = top_k_of_logits(logits, top_k)
    return _sample(list(prompt_tokens) + list(tokens), rows, top_ids, top_probs, request, domain)


def prompt_sample(prompt_tokens: Sequence[int], first_row: int, logits: np.ndarray, *, top_k: int = 32,
                  request: int = 0, domain: str = "") -> TraceSample | None:
    """The prompt's positions first_row .. len(prompt_tokens) - 2 (row r predicts prompt token
    r + 1), with the target's logits rows there ([len(prompt_tokens) - 1 - first_row, n_vocab]:
    `Engine.evaluate(prompt_tokens[:-1], all_rows=True, first_row=first_row)`); None when there
    are none."""
    n_rows = len(prompt_tokens) - 1 - first_row
    if first_row < 0:
        raise ValueError(f"first_row must be >= 0, got {first_row}")
    if n_rows <= 0:
        return None
    if logits.shape[0] != n_rows:
        raise ValueError(f"teacher rows [{logits.shape[0]}, ...] do not match the prompt's {n_rows} rows from "
                         f"row {first_row}")
    rows = np.arange(first_row, first_row + n_rows, dtype=np.int32)
    top_ids, top_probs = top_k_of_logits(logits, top_k)
    return _sample(list(prompt_tokens), rows, top_ids, top_probs, request, domain)


def merge_samples(a: TraceSample | None, b: TraceSample | None) -> TraceSample | None:
    """One sample with both samples' positions (of the same request: one's tokens a prefix of
    the other's; rows taken by both keep a's); top-k columns padded to the wider one with -1."""
    if a is None or b is None:
        return a if b is None else b
    long_, short = (a, b) if a.tokens.shape[0] >= b.tokens.shape[0] else (b, a)
    if not np.array_equal(long_.tokens[: short.tokens.shape[0]], short.tokens):
        raise ValueError("the samples are not of one request: neither's tokens start the other's")
    if a.hidden is not None or b.hidden is not None:
        raise ValueError("samples with hidden states cannot be merged")
    keep_b = ~np.isin(b.rows, a.rows)
    k = max(a.top_ids.shape[1], b.top_ids.shape[1])

    def widen(ids: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pad = k - ids.shape[1]
        return (np.pad(ids, ((0, 0), (0, pad)), constant_values=-1),
                np.pad(probs, ((0, 0), (0, pad)), constant_values=0.0))

    ids_a, probs_a = widen(a.top_ids, a.top_probs)
    ids_b, probs_b = widen(b.top_ids[keep_b], b.top_probs[keep_b])
    return _sample(long_.tokens.tolist(), np.concatenate([a.rows, b.rows[keep_b]]),
                   np.concatenate([ids_a, ids_b]), np.concatenate([probs_a, probs_b]), a.request, a.domain)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sample(sequence: list[int], rows: np.ndarray, top_ids: np.ndarray, top_probs: np.ndarray, request: int,
            domain: str) -> TraceSample:
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    return TraceSample(
        tokens=np.asarray(sequence[: int(rows[-1]) + 1], dtype=np.int32),
        rows=rows,
        top_ids=np.ascontiguousarray(top_ids[order], dtype=np.int32),
        top_probs=np.ascontiguousarray(top_probs[order], dtype=np.float32),
        request=request,
        domain=domain,
    )


class ReplayBuffer:
    """Thread-safe FIFO of TraceSamples, bounded by training positions and by age, and a
    reservoir of samples already trained on, for rehearsal.

    limit: the most positions (rows) held; adding beyond it evicts the oldest samples (the
    newest sample always stays, even when it alone exceeds the limit).
    max_age: samples from more than max_age requests before the newest are evicted (None: no
    age limit). Nothing else removes samples: a trainer takes a snapshot and releases exactly
    those samples once their update has been applied (OSD releases its buffer after an update).
    rehearsal_limit: positions the reservoir of released samples holds (0: none, released
    samples are dropped). Once full, each released sample replaces random ones with the
    probability that keeps the reservoir about a uniform sample of everything released so far
    (reservoir sampling by sample, bounded by positions): an old domain keeps its share.
    """

    def __init__(self, limit: int, max_age: int | None = None, *, rehearsal_limit: int = 0, seed: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"buffer limit must be >= 1 position, got {limit}")
        if max_age is not None and max_age < 0:
            raise ValueError(f"max_age must be >= 0 requests or None, got {max_age}")
        if rehearsal_limit < 0:
            raise ValueError(f"rehearsal_limit must be >= 0 positions, got {rehearsal_limit}")
        self.limit = limit
        self.max_age = max_age
        self.rehearsal_limit = rehearsal_limit
        self._samples: list[TraceSample] = []
        self._n_positions = 0
        self.n_evicted = 0  # samples dropped by the limits
        self._released: list[TraceSample] = []  # the reservoir
        self._released_positions = 0
        self._n_released = 0  # samples ever released
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def n_positions(self) -> int:
        return self._n_positions

    def add(self, sample: TraceSample) -> None:
        with self._lock:
            self._samples.append(sample)
            self._n_positions += sample.n_rows
            self._evict(newest_request=sample.request)

    def expire(self, newest_request: int) -> None:
        """Applies max_age as of request `newest_request` (called for requests without samples)."""
        with self._lock:
            self._evict(newest_request)

    def snapshot(self) -> list[TraceSample]:
        with self._lock:
            return list(self._samples)

    def remove(self, samples: Iterable[TraceSample]) -> None:
        """Removes these samples (by identity) if still present."""
        gone = {id(s) for s in samples}
        with self._lock:
            kept = [s for s in self._samples if id(s) not in gone]
            self._n_positions -= sum(s.n_rows for s in self._samples) - sum(s.n_rows for s in kept)
            self._samples = kept

    def release(self, samples: Iterable[TraceSample]) -> None:
        """Removes these samples (trained on by an update that reached the engine) and offers
        each to the rehearsal reservoir."""
        samples = list(samples)
        self.remove(samples)
        with self._lock:
            for sample in samples:
                self._offer(sample)

    @property
    def n_rehearsal_positions(self) -> int:
        return self._released_positions

    def rehearsal(self, n_positions: int) -> list[TraceSample]:
        """Random released samples (no repeats) holding about n_positions positions (at least
        that many, unless the reservoir holds fewer)."""
        with self._lock:
            order = self._random.sample(self._released, len(self._released))
        chosen, total = [], 0
        for sample in order:
            if total >= n_positions:
                break
            chosen.append(sample)
            total += sample.n_rows
        return chosen

    def _offer(self, sample: TraceSample) -> None:  # with self._lock held
        self._n_released += 1
        if sample.n_rows == 0 or sample.n_rows > self.rehearsal_limit:
            return
        if self._released_positions + sample.n_rows > self.rehearsal_limit:
            # Keep it with probability (samples held / samples seen), as reservoir sampling
            # does, and make room by dropping random samples.
            if self._random.random() >= len(self._released) / self._n_released:
                return
            while self._released_positions + sample.n_rows > self.rehearsal_limit:
                gone = self._released.pop(self._random.randrange(len(self._released)))
                self._released_positions -= gone.n_rows
        self._released.append(sample)
        self._released_positions += sample.n_rows

    def _evict(self, newest_request: int) -> None:
        n_old = 0
        if self.max_age is not None:
            n_old = sum(1 for _ in itertools.takewhile(
                lambda s: newest_request - s.request > self.max_age, self._samples))
        n_drop = n_old
        positions = self._n_positions - sum(s.n_rows for s in self._samples[:n_old])
        while positions > self.limit and n_drop < len(self._samples) - 1:
            positions -= self._samples[n_drop].n_rows
            n_drop += 1
        if n_drop:
            self._n_positions -= sum(s.n_rows for s in self._samples[:n_drop])
            del self._samples[:n_drop]
            self.n_evicted += n_drop
