"""Results of a generation: text, tokens, statistics and the per-step trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


def depth_counts(accept_histogram: list[int], n_empty_drafts: int, depth: int) -> list[int]:
    """Of a generation's steps, those that drafted and accepted at least k draft tokens, for k =
    0..depth (k = 0: every step that drafted; GenerationStats.accept_histogram counts the steps
    that drafted nothing among those that accepted 0). Pooled over generations, counts[k] /
    counts[k - 1] is a greedy chain's acceptance at depth k."""
    h = list(accept_histogram) + [0] * max(0, depth + 1 - len(accept_histogram))
    h[0] -= n_empty_drafts
    return [sum(h[k:]) for k in range(depth + 1)]


@dataclass(frozen=True)
class GenerationStats:
    """Statistics of one generation. Names are stable: scripts may rely on them."""

    n_prompt_tokens: int
    n_prompt_cached: int  # prompt tokens whose KV was kept from earlier requests (prefix cache)
    n_generated: int
    n_target_calls: int  # target decodes after prefill, one per speculative step
    n_drafted: int  # draft tokens proposed (tree nodes for tree and beam)
    n_accepted: int  # draft tokens accepted
    n_candidate_tokens: int  # tokens drafted before compression (beam: beams x length per step)
    n_draft_decodes: int  # draft-model decodes (prefill included); 0 for model-free methods
    n_empty_drafts: int  # steps that verified no draft token (auto: plain decoding steps)
    n_head_drafts: int  # steps that verified a draft of the draft head (redrafter; auto when it chose the head)
    n_head_accepted: int  # draft tokens of the head accepted
    acceptance_rate: float  # n_accepted / n_drafted
    tokens_per_target_call: float  # n_generated / n_target_calls
    tokens_per_second: float  # n_generated / generation time (prefill excluded)
    mean_draft_size: float  # n_drafted / n_target_calls (tree size for tree and beam)
    mean_accepted_depth: float  # n_accepted / n_target_calls
    compression_ratio: float  # n_candidate_tokens / n_drafted (beam tokens per tree node; 1 otherwise)
    accept_histogram: list[int]  # [max depth + 1] steps that accepted i draft tokens
    t_prefill_ms: float
    t_draft_ms: float
    t_verify_ms: float
    t_other_ms: float
    t_total_ms: float
    t_target_ms: float = 0.0  # part of t_verify_ms: the target decodes (the rest is host work)
    backend_argmax: bool = False  # the target's rows' argmax was taken on its backend (no rows on the host)

    @classmethod
    def _from_core(cls, s: Any) -> "GenerationStats":
        return cls(
            n_prompt_tokens=s.n_prompt_tokens,
            n_prompt_cached=s.n_prompt_cached,
            n_generated=s.n_generated,
            n_target_calls=s.n_target_calls,
            n_drafted=s.n_drafted,
            n_accepted=s.n_accepted,
            n_candidate_tokens=s.n_candidate_tokens,
            n_draft_decodes=s.n_draft_decodes,
            n_empty_drafts=s.n_empty_drafts,
            n_head_drafts=s.n_head_drafts,
            n_head_accepted=s.n_head_accepted,
            acceptance_rate=s.acceptance_rate,
            tokens_per_target_call=s.tokens_per_target_call,
            tokens_per_second=s.tokens_per_second,
            mean_draft_size=s.mean_draft_size,
            mean_accepted_depth=s.mean_accepted_depth,
            compression_ratio=s.compression_ratio,
            accept_histogram=list(s.accept_histogram),
            t_prefill_ms=s.t_prefill_ms,
            t_draft_ms=s.t_draft_ms,
            t_verify_ms=s.t_verify_ms,
            t_other_ms=s.t_other_ms,
            t_total_ms=s.t_total_ms,
            t_target_ms=s.t_target_ms,
            backend_argmax=bool(s.backend_argmax),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Trace:
    """Per-step record of what was drafted and where the target disagreed.

    Steps are verification steps (one target call each). Rejections are the steps where a draft
    token was rejected; for each, the target's top-k distribution (temperature 1, normalised
    over the whole vocabulary, so the k probabilities sum to <= 1) at the rejected position, and
    the rejected token with the target's probability of it (inside the top-k or not).
    """

    positions: np.ndarray  # [n_steps] int32: index in the generated tokens of the step's first draft token
    n_accepted: np.ndarray  # [n_steps] int32
    target_tokens: np.ndarray  # [n_steps] int32: recovered or bonus token of the step
    draft_offsets: np.ndarray  # [n_steps + 1] int32: step i drafted draft_tokens[off[i]:off[i+1]]
    draft_tokens: np.ndarray  # [sum of draft lengths] int32
    reject_steps: np.ndarray  # [n_rejects] int32: step index of each rejection
    reject_positions: np.ndarray  # [n_rejects] int32: index in the generated tokens of the rejected token
    top_ids: np.ndarray  # [n_rejects, k] int32
    top_probs: np.ndarray  # [n_rejects, k] float32
    reject_tokens: np.ndarray  # [n_rejects] int32: the draft token rejected there
    reject_probs: np.ndarray  # [n_rejects] float32: the target's probability of it (temperature 1)

    @property
    def n_steps(self) -> int:
        return int(self.positions.shape[0])

    def drafted(self, step: int) -> np.ndarray:
        return self.draft_tokens[self.draft_offsets[step] : self.draft_offsets[step + 1]]

    @classmethod
    def _from_core(cls, steps: list[Any], top_k: int) -> "Trace":
        n = len(steps)
        lengths = np.array([len(s.draft_tokens) for s in steps], dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        rejected = [i for i, s in enumerate(steps) if s.rejected]
        k = max([len(steps[i].top_ids) for i in rejected], default=top_k)
        top_ids = np.full((len(rejected), k), -1, dtype=np.int32)
        top_probs = np.zeros((len(rejected), k), dtype=np.float32)
        for row, i in enumerate(rejected):
            m = len(steps[i].top_ids)
            top_ids[row, :m] = steps[i].top_ids
            top_probs[row, :m] = steps[i].top_probs
        return cls(
            positions=np.array([s.position for s in steps], dtype=np.int32),
            n_accepted=np.array([s.n_accepted for s in steps], dtype=np.int32),
            target_tokens=np.array([s.target_token for s in steps], dtype=np.int32),
            draft_offsets=offsets,
            draft_tokens=np.array([t for s in steps for t in s.draft_tokens], dtype=np.int32),
            reject_steps=np.array(rejected, dtype=np.int32),
            reject_positions=np.array([steps[i].position + steps[i].n_accepted for i in rejected], dtype=np.int32),
            top_ids=top_ids,
            top_probs=top_probs,
            reject_tokens=np.array([steps[i].draft_tokens[steps[i].n_accepted] for i in rejected], dtype=np.int32),
            reject_probs=np.array([steps[i].rejected_prob for i in rejected], dtype=np.float32),
        )


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities of generated tokens under the target's own distribution (log softmax of
    the logits row each token was chosen from: temperature 1, before top_k / top_p / min_p)."""

    tokens: list[int]
    token_logprobs: np.ndarray  # [n_tokens] float32: of each generated token
    top_ids: np.ndarray  # [n_tokens, k] int32: the k likeliest tokens of each row, likeliest first
    top_logprobs: np.ndarray  # [n_tokens, k] float32

    @classmethod
    def _from_core(cls, since: Any) -> "TokenLogprobs":
        tokens, token_logprobs, top_ids, top_logprobs = since
        return cls(list(tokens), np.asarray(token_logprobs), np.asarray(top_ids), np.asarray(top_logprobs))


@dataclass(frozen=True)
class StreamChunk:
    """One piece of a generation as it streams: text that became safe to show (incomplete UTF-8
    and possible stop-string prefixes are held back, so the texts join to the result's text),
    the tokens generated since the previous chunk (their text may still be partly held back),
    and those tokens' log-probabilities when the generation asked for them."""

    text: str
    tokens: list[int]
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True)
class GenerationResult:
    text: str
    tokens: list[int]
    prompt_tokens: list[int]
    # "stop" (EOG or stop string) | "length" | "cancelled" | "error" (the partial_result of an
    # exception that stopped the generation)
    finish_reason: str
    method: str
    stats: GenerationStats
    trace: Trace = field(repr=False)
    # [n_tokens, n_vocab] float32 when generated with return_logits=True: the target's logits row
    # each token was chosen from.
    logits: np.ndarray | None = field(default=None, repr=False)
    draft: str = ""  # the draft slot asked for ("" = the default draft)
    draft_version: int = 0  # that slot's version when it drafted; 0 when no draft model drafted
    head_version: int = 0   # the draft head's version when one could draft (redrafter; auto with a head); 0 otherwise
    # When generated with logprobs=k: every generated token's log-probability and its row's top k.
    logprobs: TokenLogprobs | None = field(default=None, repr=False)
    # [n_target_calls] float32: the time of each step's target decode + verification (ms), and
    # int32: the tokens it decoded (1 + draft nodes). What the engine's cost model learns from.
    step_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32), repr=False)
    step_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the trace is left out)."""
        return {
            "text": self.text,
            "tokens": list(self.tokens),
            "finish_reason": self.finish_reason,
            "method": self.method,
            "draft": self.draft,
            "draft_version": self.draft_version,
            "head_version": self.head_version,
            "stats": self.stats.to_dict(),
        }
