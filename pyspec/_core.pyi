"""
pyspec engine core (C++ on llama.cpp). Use the pyspec package, not this module.
"""

from collections.abc import Mapping, Sequence
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray


class LogLine:
    @property
    def level(self) -> int: ...

    @property
    def text(self) -> str: ...

def chat_builtin_templates() -> list[str]:
    """Names of llama.cpp's built-in chat templates (Engine.apply_chat_template's tmpl)."""

def validate_penalties(params: PenaltyParams, n_vocab: int) -> None:
    """Raises InvalidArgumentError for a penalty or bias outside its range."""

def rpc_supported() -> bool:
    """Whether this libllama has llama.cpp's RPC backend."""

def check_rpc_endpoint(endpoint: str) -> None:
    """Raises InvalidArgumentError unless endpoint is host:port as llama.cpp's RPC backend reads it."""

def backend_description() -> str:
    """
    llama.cpp's description of the compute backends and CPU features in this process (llama_print_system_info).
    """

def drain_logs() -> list[LogLine]:
    """Returns and clears llama.cpp's buffered log lines."""

def quantize_model(in_path: str, out_path: str, file_type: int, tensor_types: Sequence[tuple[str, int]], n_threads: int = 0) -> None:
    """
    Writes out_path = in_path quantized by llama.cpp (llama_model_quantize): file_type is a llama_ftype, tensor_types (name, ggml_type) pairs override its mix per tensor.
    """

class Rng:
    def __init__(self, seed: int = 0) -> None: ...

    def uniform(self) -> float: ...

class SamplingParams:
    def __init__(self) -> None: ...

    @property
    def temperature(self) -> float: ...

    @temperature.setter
    def temperature(self, arg: float, /) -> None: ...

    @property
    def top_k(self) -> int: ...

    @top_k.setter
    def top_k(self, arg: int, /) -> None: ...

    @property
    def top_p(self) -> float: ...

    @top_p.setter
    def top_p(self, arg: float, /) -> None: ...

    @property
    def min_p(self) -> float: ...

    @min_p.setter
    def min_p(self, arg: float, /) -> None: ...

def validate_sampling(params: SamplingParams) -> None: ...

def compute_probs(logits: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], params: SamplingParams) -> NDArray[numpy.float32]:
    """Sampling distribution of one logits row [n_vocab]."""

class ChainVerdict:
    @property
    def n_accepted(self) -> int: ...

    @property
    def next_token(self) -> int: ...

    @property
    def is_bonus(self) -> bool: ...

def verify_chain_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> ChainVerdict: ...

def verify_chain_rejection(draft_tokens: Sequence[int], target_probs: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], draft_probs: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], rng: Rng) -> ChainVerdict: ...

class TreeVerdict:
    @property
    def path(self) -> list[int]: ...

    @property
    def next_token(self) -> int: ...

    @property
    def is_bonus(self) -> bool: ...

def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int], target_argmax: Sequence[int]) -> TreeVerdict: ...

def verify_tree_rejection(tokens: Sequence[int], parents: Sequence[int], target_probs: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], draft_probs: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)] | None, rng: Rng) -> TreeVerdict:
    """
    Multi-candidate rejection sampling over a tree; draft_probs None: deterministic candidates.
    """

def verify_tree_typical(tokens: Sequence[int], parents: Sequence[int], target_probs: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], epsilon: float, delta: float, rng: Rng) -> TreeVerdict: ...

class TreeBatchLayout:
    @property
    def depth(self) -> list[int]: ...

    @property
    def seq_ids(self) -> list[list[int]]: ...

    @property
    def root_seq_ids(self) -> list[int]: ...

    @property
    def leaf_seq(self) -> list[int]: ...

    @property
    def n_leaves(self) -> int: ...

def layout_tree(parents: Sequence[int]) -> TreeBatchLayout: ...

def prefix_match(beams: Sequence[int], n_beams: int, length: int) -> list[int]: ...

class BeamTree:
    @property
    def tokens(self) -> list[int]: ...

    @property
    def parents(self) -> list[int]: ...

    @property
    def node_of(self) -> list[int]: ...

def beams_to_tree(beams: Sequence[int], n_beams: int, length: int) -> BeamTree: ...

MAX_TREE_NODES: int = 63

def drafter_methods() -> list[tuple[str, str, bool]]:
    """
    The engine's drafting methods in display order: (name, draft-model use 'never' | 'required' | 'optional', requires a draft head).
    """

class TreeParams:
    def __init__(self) -> None: ...

    @property
    def n_nodes(self) -> int: ...

    @n_nodes.setter
    def n_nodes(self, arg: int, /) -> None: ...

    @property
    def depth(self) -> int: ...

    @depth.setter
    def depth(self, arg: int, /) -> None: ...

    @property
    def branching(self) -> int: ...

    @branching.setter
    def branching(self, arg: int, /) -> None: ...

    @property
    def n_expand(self) -> int: ...

    @n_expand.setter
    def n_expand(self, arg: int, /) -> None: ...

class BeamParams:
    def __init__(self) -> None: ...

    @property
    def n_beams(self) -> int: ...

    @n_beams.setter
    def n_beams(self, arg: int, /) -> None: ...

    @property
    def length(self) -> int: ...

    @length.setter
    def length(self, arg: int, /) -> None: ...

class PoolParams:
    def __init__(self) -> None: ...

    @property
    def enabled(self) -> bool: ...

    @enabled.setter
    def enabled(self, arg: bool, /) -> None: ...

    @property
    def n_branches(self) -> int: ...

    @n_branches.setter
    def n_branches(self, arg: int, /) -> None: ...

    @property
    def phrase_len(self) -> int: ...

    @phrase_len.setter
    def phrase_len(self, arg: int, /) -> None: ...

    @property
    def max_nodes(self) -> int: ...

    @max_nodes.setter
    def max_nodes(self, arg: int, /) -> None: ...

    @property
    def harvest_prompt(self) -> bool: ...

    @harvest_prompt.setter
    def harvest_prompt(self, arg: bool, /) -> None: ...

    @property
    def harvest_generated(self) -> bool: ...

    @harvest_generated.setter
    def harvest_generated(self, arg: bool, /) -> None: ...

    @property
    def harvest_verification(self) -> bool: ...

    @harvest_verification.setter
    def harvest_verification(self, arg: bool, /) -> None: ...

class AutoParams:
    def __init__(self) -> None: ...

    @property
    def max_depth(self) -> int: ...

    @max_depth.setter
    def max_depth(self, arg: int, /) -> None: ...

    @property
    def max_nodes(self) -> int: ...

    @max_nodes.setter
    def max_nodes(self, arg: int, /) -> None: ...

    @property
    def max_gamma(self) -> int: ...

    @max_gamma.setter
    def max_gamma(self, arg: int, /) -> None: ...

    @property
    def head_tree_nodes(self) -> int: ...

    @head_tree_nodes.setter
    def head_tree_nodes(self, arg: int, /) -> None: ...

    @property
    def adapt_costs(self) -> bool: ...

    @adapt_costs.setter
    def adapt_costs(self, arg: bool, /) -> None: ...

    @property
    def use_draft_model(self) -> bool: ...

    @use_draft_model.setter
    def use_draft_model(self, arg: bool, /) -> None: ...

    @property
    def use_head(self) -> bool: ...

    @use_head.setter
    def use_head(self, arg: bool, /) -> None: ...

    @property
    def use_corpus(self) -> bool: ...

    @use_corpus.setter
    def use_corpus(self, arg: bool, /) -> None: ...

    @property
    def corpus_max_depth(self) -> int: ...

    @corpus_max_depth.setter
    def corpus_max_depth(self, arg: int, /) -> None: ...

    @property
    def corpus_min_total(self) -> int: ...

    @corpus_min_total.setter
    def corpus_min_total(self, arg: int, /) -> None: ...

    @property
    def check_history(self) -> bool: ...

    @check_history.setter
    def check_history(self, arg: bool, /) -> None: ...

class FlashAttentionTiming:
    """
    Decodes timed with flash attention off and on at one depth (Engine.time_flash_attention): medians in ms, paired ratios on / off.
    """

    def __init__(self, depth: int, ratio: float, batch_ratio: float, ms_off: float = 0.0, ms_on: float = 0.0, batch_ms_off: float = 0.0, batch_ms_on: float = 0.0, window: int = 0, rounds: int = 0) -> None: ...

    @property
    def depth(self) -> int: ...

    @property
    def window(self) -> int: ...

    @property
    def ms_off(self) -> float: ...

    @property
    def ms_on(self) -> float: ...

    @property
    def batch_ms_off(self) -> float: ...

    @property
    def batch_ms_on(self) -> float: ...

    @property
    def ratio(self) -> float: ...

    @property
    def batch_ratio(self) -> float: ...

    @property
    def rounds(self) -> int: ...

class FlashAttentionDecision:
    """
    The flash-attention choice from timings at two depths (spec/calibrate.h).
    """

    @property
    def near(self) -> FlashAttentionTiming: ...

    @property
    def far(self) -> FlashAttentionTiming: ...

    @property
    def at_depth(self) -> int: ...

    @property
    def plain_ratio(self) -> float: ...

    @property
    def verify_ratio(self) -> float: ...

    @property
    def ratio(self) -> float: ...

    @property
    def on(self) -> bool: ...

FLASH_ATTN_BATCH: int = 8

FLASH_ATTN_REQUEST_DEPTH: int = 320

FLASH_ATTN_MARGIN: float = 0.02

def flash_attention_depths(n_ctx: int) -> tuple[int, int]:
    """
    The two context depths the flash-attention timing runs at, within a window of n_ctx.
    """

def flash_attention_at_depth(n_ctx: int) -> int:
    """
    The context depth the flash-attention choice is made for, within a window of n_ctx.
    """

def choose_flash_attention(near: FlashAttentionTiming, far: FlashAttentionTiming, at_depth: int) -> FlashAttentionDecision:
    """The flash-attention choice from timings at two depths, shallow first."""

class CostCurve:
    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, n_tokens: Sequence[int], ms: Sequence[float]) -> None: ...

    @property
    def n_tokens(self) -> list[int]: ...

    @n_tokens.setter
    def n_tokens(self, arg: Sequence[int], /) -> None: ...

    @property
    def ms(self) -> list[float]: ...

    @ms.setter
    def ms(self, arg: Sequence[float], /) -> None: ...

    def at(self, k: int) -> float: ...

    @property
    def empty(self) -> bool: ...

class AcceptanceStats:
    def __init__(self) -> None: ...

    def estimate(self, kind: int, depth: int) -> float: ...

    def record(self, kind: int, depth: int, accepted: bool) -> None: ...

    def record_outcome(self, tokens: Sequence[int], parents: Sequence[int], kinds: Sequence[int], actual: Sequence[int]) -> None: ...

    def model_acceptance(self) -> float: ...

    def clear(self) -> None: ...

def kind_lookup(match_len: int) -> int: ...

def kind_pool(match_len: int) -> int: ...

def kind_model(probability: float) -> int: ...

def kind_lookup_contested() -> int: ...

def kind_lookup_boundary(match_len: int) -> int: ...

def kind_lookup_substituted() -> int: ...

def kind_lookup_resync() -> int: ...

def kind_lookup_substituted_loose() -> int: ...

def kind_lookup_fence() -> int: ...

def kind_lookup_answer_start() -> int: ...

def kind_head_alternative() -> int: ...

def kind_corpus(confidence: float) -> int: ...

def fnv1a64(data: bytes) -> int:
    """
    FNV-1a 64 of bytes (spec/checksum.h: the checksum of pyspec's file formats).
    """

CORPUS_MIN_CONFIDENCE: float = 0.3

class NgramTable:
    """A static n-gram table (spec/ngram_table.h)."""

    @staticmethod
    def load(path: str, n_vocab: int, vocab_fingerprint: str) -> NgramTable: ...

    def predict(self, tokens: Sequence[int], min_total: int) -> tuple[int, int, int] | None:
        """
        (token, count, total) after tokens, as method auto looks it up; None when none.
        """

    @property
    def size(self) -> int: ...

    @property
    def path(self) -> str: ...

def ngram_key(context: Sequence[int]) -> int:
    """
    The n-gram table key of a context (spec/ngram_table.h), for tests and tools.
    """

NUM_KINDS: int = 96

KIND_DEPTHS: int = 8

def kind_name(kind: int) -> str: ...

class DraftPlan:
    @property
    def keep(self) -> list[int]: ...

    @property
    def expected_tokens(self) -> float: ...

    @property
    def ms(self) -> float: ...

def plan_draft(parents: Sequence[int], kinds: Sequence[int], stats: AcceptanceStats, step_ms: Sequence[float], sunk_ms: float) -> DraftPlan: ...

class ChainPlan:
    @property
    def gamma(self) -> int: ...

    @property
    def expected_tokens(self) -> float: ...

    @property
    def ms(self) -> float: ...

@overload
def plan_chain(alpha: float, step_ms: Sequence[float], draft_token_ms: float, gamma_max: int, fixed_ms: float = 0.0) -> ChainPlan: ...

@overload
def plan_chain(alpha: Sequence[float], step_ms: Sequence[float], draft_token_ms: float, gamma_max: int, fixed_ms: float = 0.0) -> ChainPlan: ...

class CostModel:
    def __init__(self) -> None: ...

    def set_prior(self, prior: CostCurve) -> None: ...

    @property
    def prior(self) -> CostCurve: ...

    def at(self, k: int) -> float: ...

    def table(self, k_max: int, corrected: bool = True) -> list[float]: ...

    def observe(self, k: int, ms: float) -> None: ...

    def correction(self, k: int) -> float: ...

    def n_observed(self, k: int) -> int: ...

    @property
    def n_observed_total(self) -> int: ...

def replay_auto(requests: Sequence[tuple[Sequence[int], Sequence[int]]], curve: CostCurve, lookup: LookupParams, pool: PoolParams, params: AutoParams, pool_capacity: int = 65536, actual: CostCurve | None = None, corpus: NgramTable | None = None) -> list[tuple[list[int], list[int], list[int]]]: ...

class LookupParams:
    def __init__(self) -> None: ...

    @property
    def ngram_max(self) -> int: ...

    @ngram_max.setter
    def ngram_max(self, arg: int, /) -> None: ...

    @property
    def ngram_min(self) -> int: ...

    @ngram_min.setter
    def ngram_min(self, arg: int, /) -> None: ...

    @property
    def stop_tokens(self) -> list[int]: ...

    @stop_tokens.setter
    def stop_tokens(self, arg: Sequence[int], /) -> None: ...

    @property
    def blank_line_tokens(self) -> list[int]: ...

    @blank_line_tokens.setter
    def blank_line_tokens(self, arg: Sequence[int], /) -> None: ...

    @property
    def unit_start_tokens(self) -> list[int]: ...

    @unit_start_tokens.setter
    def unit_start_tokens(self, arg: Sequence[int], /) -> None: ...

    @property
    def unit_ends(self) -> bool: ...

    @unit_ends.setter
    def unit_ends(self, arg: bool, /) -> None: ...

    @property
    def substitutions(self) -> bool: ...

    @substitutions.setter
    def substitutions(self, arg: bool, /) -> None: ...

    @property
    def resync(self) -> bool: ...

    @resync.setter
    def resync(self, arg: bool, /) -> None: ...

    @property
    def loose_substitutions(self) -> bool: ...

    @loose_substitutions.setter
    def loose_substitutions(self, arg: bool, /) -> None: ...

    @property
    def fence_tokens(self) -> list[int]: ...

    @fence_tokens.setter
    def fence_tokens(self, arg: Sequence[int], /) -> None: ...

    @property
    def fences(self) -> bool: ...

    @fences.setter
    def fences(self, arg: bool, /) -> None: ...

class PenaltyParams:
    """Penalties and biases on the target's logits (spec/penalties.h)."""

    def __init__(self) -> None: ...

    @property
    def presence_penalty(self) -> float: ...

    @presence_penalty.setter
    def presence_penalty(self, arg: float, /) -> None: ...

    @property
    def frequency_penalty(self) -> float: ...

    @frequency_penalty.setter
    def frequency_penalty(self, arg: float, /) -> None: ...

    @property
    def repetition_penalty(self) -> float: ...

    @repetition_penalty.setter
    def repetition_penalty(self, arg: float, /) -> None: ...

    @property
    def logit_bias(self) -> list[tuple[int, float]]: ...

    @logit_bias.setter
    def logit_bias(self, arg: list[tuple[int, float]], /) -> None: ...

class GenerateParams:
    def __init__(self) -> None: ...

    @property
    def max_tokens(self) -> int: ...

    @max_tokens.setter
    def max_tokens(self, arg: int, /) -> None: ...

    @property
    def sampling(self) -> SamplingParams: ...

    @sampling.setter
    def sampling(self, arg: SamplingParams, /) -> None: ...

    @property
    def stop(self) -> list[str]: ...

    @stop.setter
    def stop(self, arg: Sequence[str], /) -> None: ...

    @property
    def method(self) -> str: ...

    @method.setter
    def method(self, arg: str, /) -> None: ...

    @property
    def draft(self) -> str: ...

    @draft.setter
    def draft(self, arg: str, /) -> None: ...

    @property
    def n_draft(self) -> int: ...

    @n_draft.setter
    def n_draft(self, arg: int, /) -> None: ...

    @property
    def scheduler(self) -> AutoParams: ...

    @scheduler.setter
    def scheduler(self, arg: AutoParams, /) -> None: ...

    @property
    def tree(self) -> TreeParams: ...

    @tree.setter
    def tree(self, arg: TreeParams, /) -> None: ...

    @property
    def beam(self) -> BeamParams: ...

    @beam.setter
    def beam(self, arg: BeamParams, /) -> None: ...

    @property
    def lookup(self) -> LookupParams: ...

    @lookup.setter
    def lookup(self, arg: LookupParams, /) -> None: ...

    @property
    def pool(self) -> PoolParams: ...

    @pool.setter
    def pool(self, arg: PoolParams, /) -> None: ...

    @property
    def acceptance(self) -> str: ...

    @acceptance.setter
    def acceptance(self, arg: str, /) -> None: ...

    @property
    def typical_epsilon(self) -> float: ...

    @typical_epsilon.setter
    def typical_epsilon(self, arg: float, /) -> None: ...

    @property
    def typical_delta(self) -> float: ...

    @typical_delta.setter
    def typical_delta(self, arg: float, /) -> None: ...

    @property
    def trace_top_k(self) -> int: ...

    @trace_top_k.setter
    def trace_top_k(self, arg: int, /) -> None: ...

    @property
    def return_logits(self) -> bool: ...

    @return_logits.setter
    def return_logits(self, arg: bool, /) -> None: ...

    @property
    def backend_argmax(self) -> int: ...

    @backend_argmax.setter
    def backend_argmax(self, arg: int, /) -> None: ...

    @property
    def logprobs(self) -> int: ...

    @logprobs.setter
    def logprobs(self, arg: int, /) -> None: ...

    @property
    def seed(self) -> int | None: ...

    @seed.setter
    def seed(self, arg: int | None, /) -> None: ...

    @property
    def grammar(self) -> str: ...

    @grammar.setter
    def grammar(self, arg: str, /) -> None: ...

    @property
    def grammar_root(self) -> str: ...

    @grammar_root.setter
    def grammar_root(self, arg: str, /) -> None: ...

    @property
    def grammar_drafts(self) -> bool: ...

    @grammar_drafts.setter
    def grammar_drafts(self, arg: bool, /) -> None: ...

    @property
    def penalties(self) -> PenaltyParams: ...

    @penalties.setter
    def penalties(self, arg: PenaltyParams, /) -> None: ...

class Stats:
    @property
    def n_prompt_tokens(self) -> int: ...

    @property
    def n_prompt_cached(self) -> int: ...

    @property
    def n_generated(self) -> int: ...

    @property
    def n_target_calls(self) -> int: ...

    @property
    def n_drafted(self) -> int: ...

    @property
    def n_accepted(self) -> int: ...

    @property
    def n_candidate_tokens(self) -> int: ...

    @property
    def n_draft_decodes(self) -> int: ...

    @property
    def n_empty_drafts(self) -> int: ...

    @property
    def n_head_drafts(self) -> int: ...

    @property
    def n_head_accepted(self) -> int: ...

    @property
    def backend_argmax(self) -> bool: ...

    @property
    def accept_histogram(self) -> list[int]: ...

    @property
    def t_prefill_ms(self) -> float: ...

    @property
    def t_draft_ms(self) -> float: ...

    @property
    def t_verify_ms(self) -> float: ...

    @property
    def t_other_ms(self) -> float: ...

    @property
    def t_target_ms(self) -> float: ...

    @property
    def t_total_ms(self) -> float: ...

    @property
    def acceptance_rate(self) -> float: ...

    @property
    def tokens_per_target_call(self) -> float: ...

    @property
    def mean_draft_size(self) -> float: ...

    @property
    def mean_accepted_depth(self) -> float: ...

    @property
    def compression_ratio(self) -> float: ...

    @property
    def tokens_per_second(self) -> float: ...

class StepTrace:
    @property
    def position(self) -> int: ...

    @property
    def draft_tokens(self) -> list[int]: ...

    @property
    def n_accepted(self) -> int: ...

    @property
    def target_token(self) -> int: ...

    @property
    def rejected(self) -> bool: ...

    @property
    def top_ids(self) -> list[int]: ...

    @property
    def top_probs(self) -> list[float]: ...

    @property
    def rejected_prob(self) -> float: ...

class GenerateResult:
    def __init__(self) -> None: ...

    @property
    def text(self) -> str: ...

    @property
    def prompt_tokens(self) -> list[int]: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def draft_version(self) -> int: ...

    @property
    def head_version(self) -> int: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def trace(self) -> list[StepTrace]: ...

    @property
    def n_tokens(self) -> int: ...

    def since(self, first: int = 0) -> tuple: ...

    @property
    def step_ms(self) -> list[float]: ...

    @property
    def step_sizes(self) -> list[int]: ...

    def take_logits(self, n_vocab: int) -> NDArray[numpy.float32]:
        """Moves the return_logits rows out as a numpy array [n_tokens, n_vocab]."""

class Model:
    """A loaded GGUF model and its context (from Engine.load_draft)."""

    @property
    def path(self) -> str: ...

    @property
    def n_vocab(self) -> int: ...

class DraftHead:
    """A loaded draft head (from Engine.load_head)."""

    @property
    def path(self) -> str: ...

    @property
    def n_embd(self) -> int: ...

    @property
    def n_kept(self) -> int: ...

    @property
    def n_res_layers(self) -> int: ...

    @property
    def vocab(self) -> list[int]: ...

    @property
    def backend(self) -> str: ...

    @property
    def kind(self) -> str:
        """'redrafter' (recurrent head) or 'eagle' (EAGLE-class head without attention)."""

    def row_of(self, token: int) -> int: ...

    def initial_state(self, hidden: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]:
        """The state [n, n_embd] of rows before their first step: zeros, or the hidden states."""

    def step(self, hidden: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], state: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], rows: Sequence[int]) -> tuple[NDArray[numpy.float32], NDArray[numpy.float32]]:
        """One head step for n rows: (logits [n, n_kept], new state [n, n_embd])."""

class Learnt:
    """
    What method auto had learnt at one moment (from Engine.learnt); opaque.
    """

    @property
    def n_observed_steps(self) -> int:
        """steps the target's cost corrections had seen"""

class Engine:
    def __init__(self, target: str, draft: str, n_ctx: int, n_batch: int, n_threads: int, n_gpu_layers: int, n_seq_max: int, use_extra_bufts: bool, seed: int, reuse_prefix: bool = True, pool_capacity: int | None = None, repack_weights: bool = False, huge_pages: bool = True, flash_attn: bool = False, rpc_servers: Sequence[str] = []) -> None: ...

    def generate(self, prompt_tokens: Sequence[int], params: GenerateParams, on_text: object | None = None, partial: GenerateResult | None = None) -> GenerateResult:
        """
        partial: a GenerateResult that receives the output so far when an error stops the generation.
        """

    def evaluate(self, tokens: Sequence[int], use_draft: bool = False, all_rows: bool = False, draft_name: str = '', first_row: int = 0) -> NDArray[numpy.float32]: ...

    def evaluate_hidden(self, tokens: Sequence[int]) -> tuple[NDArray[numpy.float32], NDArray[numpy.float32]]:
        """
        Target logits [n, n_vocab] and hidden states [n, n_hidden] (final norm applied) of every row.
        """

    def evaluate_top_k(self, tokens: Sequence[int], first_row: int, k: int) -> tuple[NDArray[numpy.int32], NDArray[numpy.float32], NDArray[numpy.float32]]:
        """
        The target's top-k ids and probabilities [n - first_row, k] and hidden states [n - first_row, n_hidden].
        """

    def cost_signature(self, use_draft: bool, draft_name: str = '') -> str: ...

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes: ...

    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...

    def apply_chat_template(self, messages: Sequence[tuple[str, str]], add_assistant: bool = True, tmpl: str = '') -> str: ...

    @property
    def chat_template(self) -> str: ...

    @property
    def special_tokens(self) -> dict:
        """The target's special token ids (-1: none) and whether tokenize() adds bos."""

    def is_eog(self, arg: int, /) -> bool: ...

    def control_tokens(self) -> list[int]: ...

    def layout_tokens(self) -> tuple[list[int], list[int], list[int]]:
        """
        (blank_line_tokens, unit_start_tokens, fence_tokens) of the target's vocabulary (LookupParams).
        """

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_repacked(self) -> int: ...

    @property
    def has_draft(self) -> bool: ...

    def has_draft_named(self, name: str) -> bool: ...

    def draft_names(self) -> list[str]: ...

    def draft_version(self, name: str = '') -> int: ...

    def load_draft(self, path: str) -> Model: ...

    def swap_draft(self, model: Model, name: str = '') -> None: ...

    def reload_draft(self, path: str, name: str = '') -> None: ...

    def remove_draft(self, name: str) -> None: ...

    def load_head(self, path: str) -> DraftHead: ...

    def swap_head(self, head: DraftHead) -> None: ...

    def remove_head(self) -> None: ...

    @property
    def has_head(self) -> bool: ...

    @property
    def head_version(self) -> int: ...

    @property
    def head_path(self) -> str: ...

    def load_ngram(self, path: str) -> NgramTable: ...

    def swap_ngram(self, table: NgramTable) -> None: ...

    def remove_ngram(self) -> None: ...

    @property
    def ngram_path(self) -> str: ...

    @property
    def ngram_size(self) -> int: ...

    @property
    def vocab_fingerprint(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def describe(self, use_draft: bool = False, draft_name: str = '') -> tuple[str, int, int, int]: ...

    def pool_stats(self) -> dict: ...

    def save_pool(self, path: str) -> None: ...

    def load_pool(self, path: str) -> None: ...

    def clear_pool(self) -> None: ...

    def measure_cost(self, use_draft: bool, draft_name: str = '', sizes: Sequence[int] = [], repeats: int = 3, progress: object | None = None, context: int = 128) -> CostCurve:
        """
        Times decodes of k tokens on top of `context` cached tokens and installs the cost curve (method 'auto').
        """

    def decide_flash_attention(self, n_decodes: int = 2, rounds: int = 12, progress: object | None = None) -> FlashAttentionDecision:
        """
        Times the target with flash attention off and on at flash_attention_depths(n_ctx) and chooses for flash_attention_at_depth(n_ctx) (the engine's own cache is left alone).
        """

    def time_flash_attention(self, depths: Sequence[int], n_decodes: int = 2, rounds: int = 12, batch: int = 8, progress: object | None = None) -> list[FlashAttentionTiming]:
        """
        Times the target's decodes of one token and of `batch` tokens (a row each) on top of each of `depths` cached tokens with flash attention off and on, each setting in a temporary context of its own (the engine's cache is left alone) as wide as the engine's window up to 4,096 cells: a FlashAttentionTiming per depth (medians in ms, and the medians of the per-round paired ratios on / off).
        """

    def time_decodes(self, sizes: Sequence[int], repeats: int = 3, all_rows: bool = True, context: int = 128, non_decreasing: bool = True, progress: object | None = None) -> CostCurve:
        """
        Times the target's decodes of k tokens as calibration does, with a logits row for every token (all_rows) or for the last one only; the medians as measured when non_decreasing is false (calibration makes them a running maximum); progress(done, total) after each decode; installs nothing.
        """

    def set_cost(self, use_draft: bool, curve: CostCurve, draft_name: str = '') -> None: ...

    def cost(self, use_draft: bool = False, draft_name: str = '') -> CostCurve: ...

    def kv_state(self, use_draft: bool = False, draft_name: str = '') -> tuple[list[int], list[int]]:
        """
        (tokens the prefix cache holds in sequence 0, llama.cpp's highest position per sequence or -1)
        """

    def cost_model(self) -> CostModel:
        """
        A copy of the target's cost model: its calibration prior and the corrections learnt from the steps decoded so far.
        """

    def learnt(self) -> Learnt:
        """
        A copy of what method auto has learnt across requests: acceptance statistics, the target's cost corrections, the head's record.
        """

    def restore_learnt(self, state: Learnt) -> None:
        """
        Puts a copy from learnt() back (the head's part only if the same head is loaded).
        """

    def acceptance_counts(self) -> dict[str, list[float]]:
        """
        Method auto's acceptance statistics as counts per statistics key (AcceptanceStats::counts).
        """

    def set_acceptance_counts(self, counts: Mapping[str, Sequence[float]], without_model: Sequence[str] = []) -> None:
        """
        Replaces auto's acceptance statistics by counts from acceptance_counts(); checks them all first. The keys in without_model lose their draft model's counts.
        """

    def system_info(self) -> str: ...

    def close(self) -> None: ...
