"""Generation settings: one dataclass for every knob of Engine.generate / Engine.stream."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from .errors import InvalidArgumentError
from .grammar import json_schema_grammar

# The engine's drafting methods, from its registration table (engine/src/drafter_registry.cpp).
METHODS = tuple(name for name, _, _ in _core.drafter_methods())
# The methods that cannot run without a draft model, and those that need a draft head.
METHODS_NEEDING_DRAFT = tuple(name for name, use, _ in _core.drafter_methods() if use == "required")
METHODS_NEEDING_HEAD = tuple(name for name, _, head in _core.drafter_methods() if head)

# The real model pair the demo, the benchmark and `pyspec calibrate` use by default.
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

# Draft length per chain-like method when n_draft is not given: what measured best on the 2-core
# development machine (`pyspec bench`, README "Measured results"). A free drafter affords longer
# drafts than a draft model whose every token costs a decode.
DEFAULT_N_DRAFT = {"chain": 4, "lookup": 8, "ouroboros": 4}

# The temperature `pyspec serve` samples at when a request gives none: OpenAI's default, so that
# OpenAI clients get what they expect. The Python API and `pyspec generate` stay greedy
# (GenerationConfig.temperature = 0); a request or `pyspec serve --temperature 0` makes the server greedy.
SERVER_TEMPERATURE = 1.0


_INT32_RANGE = (-(2**31), 2**31 - 1)
_UINT64_RANGE = (0, 2**64 - 1)
_BOOL_FIELDS = {"auto_draft_model", "auto_head", "auto_corpus", "auto_adapt_costs", "lookup_unit_ends", "lookup_substitutions", "lookup_resync", "lookup_loose_substitutions", "lookup_fences", "pool", "harvest_prompt", "harvest_generated", "harvest_verification",
                "return_logits", "grammar_drafts"}
_FLOAT_FIELDS = {"temperature", "top_p", "min_p", "typical_epsilon", "typical_delta", "presence_penalty",
                 "frequency_penalty", "repetition_penalty"}
_STR_FIELDS = {"draft", "acceptance", "grammar_root"}
_OPTIONAL_STR_FIELDS = {"method", "grammar"}
_OPTIONAL_INT_FIELDS = {"n_draft", "seed", "logprobs"}
_OPTIONAL_BOOL_FIELDS = {"backend_argmax"}


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}... ({type(value).__name__})" if len(text) > 60 else f"{text} ({type(value).__name__})"


def check_text(what: str, value: Any) -> None:
    """TypeError naming `what` unless value is a str that UTF-8 can encode (no lone surrogates)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {_describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TypeError(f"{what} is not valid text (unpaired surrogate at index {exc.start})") from None


def _check_str(name: str, value: Any) -> None:
    check_text(f"GenerationConfig.{name}", value)


def _check_field(name: str, value: Any) -> None:
    if name == "json_schema":
        if value is not None and not isinstance(value, (dict, str)):
            raise TypeError(f"GenerationConfig.json_schema must be a dict, a str of JSON or None, got {_describe(value)}")
        return
    if name == "logit_bias":
        if value is None:
            return
        if not isinstance(value, Mapping):
            raise TypeError(f"GenerationConfig.logit_bias must be a dict of token id -> bias, got {_describe(value)}")
        for token, bias in value.items():
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, numbers.Integral):
                raise TypeError(f"GenerationConfig.logit_bias keys must be token ids (int), got {_describe(token)}")
            if isinstance(bias, (bool, np.bool_)) or not isinstance(bias, numbers.Real):
                raise TypeError(f"GenerationConfig.logit_bias[{token}] must be a number, got {_describe(bias)}")
        return
    if value is None and (name in _OPTIONAL_STR_FIELDS or name in _OPTIONAL_INT_FIELDS or name in _OPTIONAL_BOOL_FIELDS
                          or name == "stop"):
        return
    if name in _BOOL_FIELDS or name in _OPTIONAL_BOOL_FIELDS:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"GenerationConfig.{name} must be a bool, got {_describe(value)}")
    elif name in _FLOAT_FIELDS:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"GenerationConfig.{name} must be a number, got {_describe(value)}")
        try:
            float(value)
        except OverflowError:
            raise InvalidArgumentError(f"GenerationConfig.{name} is too large for a float: {_describe(value)}") from None
    elif name in _STR_FIELDS or name in _OPTIONAL_STR_FIELDS:
        _check_str(name, value)
    elif name == "stop":
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
            raise TypeError(f"GenerationConfig.stop must be a str or a sequence of str, got {_describe(value)}")
        for item in items:
            _check_str("stop", item)
    else:  # every other field is an int
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"GenerationConfig.{name} must be an int, got {_describe(value)}")
        low, high = _UINT64_RANGE if name == "seed" else _INT32_RANGE
        if not low <= int(value) <= high:
            raise InvalidArgumentError(f"GenerationConfig.{name} must be in [{low}, {high}], got {int(value)}")


@dataclass(frozen=True)
class GenerationConfig:
    """Everything that shapes one generation. Pass fields as keywords to generate()/stream().

    Sampling: temperature 0 is greedy; above 0 tokens follow the target's distribution after
    top_k / top_p / min_p (all verification is exact unless acceptance="typical").

    method: "auto" (the default: per step, whatever maximises expected tokens per second on this
    machine: the prompt-lookup + phrase-pool proposal trimmed to the nodes that pay, a draft-model
    chain when the draft's measured cost and running acceptance make it pay, a draft-head chain
    when the engine has a head and its measured step cost and running acceptance make it pay
    (drafted as an EAGLE-2 tree of up to auto_head_tree_nodes nodes pruned to what pays; 0:
    chains only), or plain decoding; considers paths up to auto_max_depth, auto_max_nodes nodes,
    chains up to auto_max_gamma, the draft model only when auto_draft_model, the head only when auto_head, the
    engine's n-gram table (Engine(ngram=...), `pyspec ngram build`) only when auto_corpus (chains
    of up to auto_corpus_max_depth tokens, each predicted from a context the table saw at least
    auto_corpus_min_total times); needs the cost curves of `pyspec calibrate`, measured
    on first use when missing), "none" (plain decoding), "chain" (draft model proposes a chain of n_draft tokens),
    "tree" (draft model grows candidates layer by layer, tree_depth layers, decoding the
    tree_expand best candidates of each layer together and adding their tree_branching likeliest
    tokens; the tree_nodes best candidates overall are verified), "beam" (draft-model beam search: beams x beam_length, compressed into a tree),
    "lookup" (no draft model: prompt lookup proposes up to n_draft tokens that followed an earlier
    occurrence of the last lookup_ngram_max .. lookup_ngram_min tokens, and the engine's phrase
    pool adds up to pool_branches phrases as extra branches, max(n_draft, pool_max_nodes) nodes
    in all; with lookup_unit_ends, a copied blank line before text at the left margin, the end of
    a function or paragraph of the source, is a node kind of its own, so auto learns whether the
    answers go on copying there or turn away; with lookup_substitutions, where a long copy broke
    and the output went on copying after a replacement of its own (a renamed identifier), later
    copies of the same source tokens propose the replacement (with lookup_loose_substitutions
    also after other tokens than the one it was learnt after, as a node kind of its own), and
    with lookup_resync, until the output copies again, a short match gives way to the source
    where the broken copy left off when the output's last token is the source's token a few
    positions after the break; with lookup_fences, before the answer's first token the prompt's
    last closed code block (from its fence, ```python) is proposed, and a copy whose short key holds
    such a fence starts as a node kind of its own, so auto learns whether this stream's answers
    write the given code out again),
    "ouroboros" (draft model drafts n_draft tokens phrase by phrase, checking pool phrases in its
    own decodes, then pool_branches pool phrases lengthen the draft). None means "auto".
    draft: which of the engine's draft models drafts ("" the default one, or the name of a
    slot added with Engine(drafts=...) / Engine.reload_draft(path, name=...)).

    Phrase pool (Engine.pool_stats / save_pool / load_pool / clear_pool): pool=False turns it off
    for this request (lookup is then plain prompt lookup); harvest_prompt, harvest_generated and
    harvest_verification choose what it learns from (phrases of pool_phrase_len tokens from
    prompts and outputs; target-confirmed pieces of rejected drafts). It persists across requests.

    acceptance: "exact" (rejection sampling: the target's distribution) or "typical" (Medusa's
    typical acceptance with typical_epsilon / typical_delta: LOSSY, faster acceptance of
    plausible drafts; only used when temperature > 0).
    trace_top_k: the result's trace records every step; k > 0 adds the target's top-k (and its
    probability of the rejected token) at each rejected position (0: steps only).
    return_logits: keep the target's logits row behind every generated token (result.logits).
    backend_argmax: a greedy request that reads nothing of the target's rows but their argmax
    (no logprobs, return_logits, trace_top_k, grammar or penalties) can take it on the target's
    backend (llama.cpp's backend sampling): the same tokens, no logits rows copied to the host.
    None: where the target's output layer runs on a GPU of this machine; True: always (where
    the request allows it; also worth trying with RPC servers across a network); False: never.
    logprobs: None (off, nothing computed) or k >= 0: result.logprobs holds each generated
    token's log-probability under the target's own distribution (log softmax of the row it was
    chosen from at temperature 1, before top_k / top_p / min_p) and the k likeliest tokens of
    that row with theirs.

    Constrained output (docs/constrained-output.md): grammar, a GBNF grammar (start rule
    grammar_root), or json_schema, a JSON schema (dict or JSON text; {"type": "object"} for any
    JSON object), not both. The output follows it: the target's distribution is restricted to
    the tokens it allows, and every method reproduces constrained plain decoding exactly
    (logprobs and return_logits still report the unconstrained rows). grammar_drafts: a step
    whose drafter proposes nothing drafts the text the grammar forces (a schema's keys and
    punctuation) instead.

    Penalties (OpenAI's and CTRL's, on the target's logits before top_k / top_p / min_p):
    presence_penalty and frequency_penalty (each in [-2, 2]) subtract p + f * count(t) from the
    logit of every token t the output has produced so far; repetition_penalty r (in (0, 10], 1:
    off) divides the positive logits and multiplies the negative ones of every token in the
    prompt or the output; logit_bias ({token id: bias in [-100, 100]}) adds to those logits.
    Speculation penalises every verification row for the tokens of its own path, so every
    method reproduces penalised plain decoding exactly (logprobs still report the target's own
    rows).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    stop: str | Sequence[str] | None = None
    method: str | None = None
    draft: str = ""
    n_draft: int | None = None
    auto_max_depth: int = 64
    auto_max_nodes: int = 80
    auto_max_gamma: int = 8
    auto_draft_model: bool = True
    auto_head: bool = True
    auto_head_tree_nodes: int = 16
    auto_corpus: bool = True
    auto_corpus_max_depth: int = 8
    auto_corpus_min_total: int = 10
    auto_adapt_costs: bool = True
    seed: int | None = None
    lookup_ngram_max: int = 16
    lookup_ngram_min: int = 1
    lookup_unit_ends: bool = True
    lookup_substitutions: bool = True
    lookup_resync: bool = True
    lookup_loose_substitutions: bool = True
    lookup_fences: bool = True
    tree_nodes: int = 8
    tree_depth: int = 6
    tree_branching: int = 4
    tree_expand: int = 1
    beams: int = 4
    beam_length: int = 5
    pool: bool = True
    pool_branches: int = 2
    pool_phrase_len: int = 8
    pool_max_nodes: int = 16
    harvest_prompt: bool = True
    harvest_generated: bool = True
    harvest_verification: bool = True
    acceptance: str = "exact"
    typical_epsilon: float = 0.09
    typical_delta: float = 0.3
    trace_top_k: int = 0
    return_logits: bool = False
    backend_argmax: bool | None = None
    logprobs: int | None = None
    grammar: str | None = None
    grammar_root: str = "root"
    json_schema: dict[str, Any] | str | None = None
    grammar_drafts: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        """Checks every field's type (and that integers fit the engine's 32-bit fields); the
        engine checks the ranges. Raises TypeError or InvalidArgumentError naming the field."""
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))

    def replace(self, **options: Any) -> "GenerationConfig":
        """A copy with some fields changed; unknown names raise TypeError listing the valid ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown generation option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **options)

    def resolved_method(self) -> str:
        return self.method if self.method is not None else "auto"

    def to_core(self) -> Any:
        """The engine's GenerateParams for these settings (the engine validates them)."""
        p = _core.GenerateParams()
        p.max_tokens = int(self.max_tokens)
        p.sampling.temperature = float(self.temperature)
        p.sampling.top_k = int(self.top_k)
        p.sampling.top_p = float(self.top_p)
        p.sampling.min_p = float(self.min_p)
        p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        p.method = self.resolved_method()
        p.draft = self.draft
        p.n_draft = int(self.n_draft) if self.n_draft is not None else DEFAULT_N_DRAFT.get(p.method, 4)
        p.scheduler.max_depth = int(self.auto_max_depth)
        p.scheduler.max_nodes = int(self.auto_max_nodes)
        p.scheduler.max_gamma = int(self.auto_max_gamma)
        p.scheduler.use_draft_model = bool(self.auto_draft_model)
        p.scheduler.use_head = bool(self.auto_head)
        p.scheduler.head_tree_nodes = int(self.auto_head_tree_nodes)
        p.scheduler.use_corpus = bool(self.auto_corpus)
        p.scheduler.corpus_max_depth = int(self.auto_corpus_max_depth)
        p.scheduler.corpus_min_total = int(self.auto_corpus_min_total)
        p.scheduler.adapt_costs = bool(self.auto_adapt_costs)
        p.lookup.ngram_max = int(self.lookup_ngram_max)
        p.lookup.ngram_min = int(self.lookup_ngram_min)
        p.lookup.unit_ends = bool(self.lookup_unit_ends)
        p.lookup.substitutions = bool(self.lookup_substitutions)
        p.lookup.resync = bool(self.lookup_resync)
        p.lookup.loose_substitutions = bool(self.lookup_loose_substitutions)
        p.lookup.fences = bool(self.lookup_fences)
        p.tree.n_nodes = int(self.tree_nodes)
        p.tree.depth = int(self.tree_depth)
        p.tree.branching = int(self.tree_branching)
        p.tree.n_expand = int(self.tree_expand)
        p.beam.n_beams = int(self.beams)
        p.beam.length = int(self.beam_length)
        p.pool.enabled = bool(self.pool)
        p.pool.n_branches = int(self.pool_branches)
        p.pool.phrase_len = int(self.pool_phrase_len)
        p.pool.max_nodes = int(self.pool_max_nodes)
        p.pool.harvest_prompt = bool(self.harvest_prompt)
        p.pool.harvest_generated = bool(self.harvest_generated)
        p.pool.harvest_verification = bool(self.harvest_verification)
        p.acceptance = self.acceptance
        p.typical_epsilon = float(self.typical_epsilon)
        p.typical_delta = float(self.typical_delta)
        p.seed = None if self.seed is None else int(self.seed)
        p.trace_top_k = int(self.trace_top_k)
        p.return_logits = bool(self.return_logits)
        p.backend_argmax = -1 if self.backend_argmax is None else int(bool(self.backend_argmax))
        p.logprobs = -1 if self.logprobs is None else int(self.logprobs)
        if self.grammar is not None and self.json_schema is not None:
            raise InvalidArgumentError("give grammar or json_schema, not both")
        if self.json_schema is not None:
            p.grammar = json_schema_grammar(self.json_schema)
        elif self.grammar is not None:
            p.grammar = self.grammar
        p.grammar_root = "root" if self.json_schema is not None else self.grammar_root
        p.grammar_drafts = bool(self.grammar_drafts)
        p.penalties.presence_penalty = float(self.presence_penalty)
        p.penalties.frequency_penalty = float(self.frequency_penalty)
        p.penalties.repetition_penalty = float(self.repetition_penalty)
        p.penalties.logit_bias = sorted((int(t), float(b)) for t, b in (self.logit_bias or {}).items())
        _core.validate_penalties(p.penalties, _INT32_RANGE[1])  # the ranges now; the token ids at generate
        return p
