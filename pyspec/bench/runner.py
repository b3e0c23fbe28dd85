"""`pyspec bench`: decoding methods side by side on a prompt suite, in one run.

For each prompt every method runs back to back (A B C, then B C A, ...: the order rotates by one
per prompt), so machine drift hits all methods alike and none always runs in the same slot; each
method is warmed up first; decoding is greedy (or sampled at a temperature: every method and peer
alike, top-k, top-p and min-p off) through the chat template. Methods that use the
phrase pool keep one pool per method across the prompts (history reuse as in serving; a
method never sees another method's answer to the same prompt). Besides pyspec's own methods,
peers run with the same threads, context size, weight-repacking setting and decoding (greedy or
sampled; `pyspec.bench.peers`): llama-cpp-python's plain generation and prompt-lookup decoding on the
same prompt tokens, and llama.cpp's own tools (`llama-completion`, `llama-speculative-simple` in
its n-gram and draft-model modes) on the same prompt text.

Timing: tok/s is generated tokens / wall time of the generation with prompt processing, for every
method; decode tok/s leaves prompt processing out, as each implementation measures it
(report.DECODE_NOTE). Results and their renderings: `pyspec.bench.report`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

from .peers import (LLAMA_CPP_DEFAULT_N_DRAFT, LLAMA_CPP_DRAFT, LLAMA_CPP_PEERS, PEER_PLD_N_DRAFT, PYTHON_PEERS,
                          LlamaCppPeer, PythonPeer)
from .report import (BenchReport, PromptRun, best_llama_cpp_runs, decode_within_limit, ratio_interval,
                           summarize, versus_best_llama_cpp,
                           versus_best_suite_llama_cpp)
from ..config import DEFAULT_DRAFT, DEFAULT_TARGET, METHODS_NEEDING_DRAFT, METHODS_NEEDING_HEAD

if TYPE_CHECKING:
    import numpy as np

    from ..data import Prompt
    from ..engine import Engine
    from ..results import GenerationStats

log = logging.getLogger(__name__)

__all__ = ["MethodSpec", "available_methods", "parse_methods", "run_bench", "suite_prompts", "median_run",
           "decode_tokens_per_second"]

PEER_METHODS = (*PYTHON_PEERS, *LLAMA_CPP_PEERS)
NO_DRAFT_LENGTH = ("none", "peer-llama-cpp", *(p for p in LLAMA_CPP_PEERS if p != LLAMA_CPP_DRAFT))
WARMUP_TOKENS = 8
SETTLE_S = 3.0  # run_bench's pause before each run when llama.cpp's tools run (see settle_s)
ENGINE_N_BATCH = 512  # the engine's batch; llama.cpp's tools get it as their physical batch (-ub)
# A divergence from none whose top-2 logit gap (context evaluated in one batch) is below this is a
# near-tie (docs/numerics.md); at or above it the gap is measured again one token at a time.
NEAR_TIE = 0.25

BenchPrompt = Union["Prompt", str, Sequence[dict]]


@dataclass(frozen=True)
class MethodSpec:
    label: str  # as given on the command line, e.g. "lookup:8", "tree:24", "beam:4x5"
    name: str  # a pyspec method (engine.METHODS) or a peer (PEER_METHODS)
    n_draft: int | None  # chain-like methods: None = the method's own default
    options: tuple[tuple[str, Any], ...] = ()  # tree / beam shape, auto's drafters: for generate()

    @property
    def is_peer(self) -> bool:
        return self.name in PEER_METHODS

    @property
    def is_llama_cpp(self) -> bool:
        return self.name in LLAMA_CPP_PEERS


def available_methods() -> tuple[str, ...]:
    from ..engine import METHODS

    return (*METHODS, *PEER_METHODS)


# auto:SUFFIX -> generate() options: auto without one of its learned drafters, so that one engine
# (one draft model, one head) can compare auto with and without it in a single run.
AUTO_VARIANTS = {"no-head": (("auto_head", False),), "no-draft": (("auto_draft_model", False),),
                 "no-corpus": (("auto_corpus", False),), "no-unit-ends": (("lookup_unit_ends", False),),
                 "no-substitutions": (("lookup_substitutions", False),),
                 "no-resync": (("lookup_resync", False),),
                 "no-loose": (("lookup_loose_substitutions", False),),
                 "no-fences": (("lookup_fences", False),)}
BEAM_SHAPED = ("beam", "redrafter")
TREE_SHAPED = ("tree", "eagle")  # a ':N' suffix: the node budget


def _shape_options(name: str, item: str, k: str) -> tuple[tuple[str, Any], ...]:
    """tree:N, eagle:N -> tree_nodes N; beam:KxL, redrafter:KxL -> K beams of length L; auto:no-head,
    auto:no-draft -> auto without the draft head / the draft model."""
    if name == "auto":
        if k not in AUTO_VARIANTS:
            raise ValueError(f"bad variant in {item!r}: expected {' or '.join('auto:' + v for v in AUTO_VARIANTS)}")
        return AUTO_VARIANTS[k]
    beam = name in BEAM_SHAPED
    parts = k.split("x") if beam else [k]
    if len(parts) != (2 if beam else 1) or not all(x.isdigit() and int(x) >= 1 for x in parts):
        form = f"{name}:KxL (e.g. {name}:4x5)" if beam else f"{name}:N (node budget, e.g. {name}:16)"
        raise ValueError(f"bad shape in {item!r}: expected {form}")
    if beam:
        return (("beams", int(parts[0])), ("beam_length", int(parts[1])))
    return (("tree_nodes", int(parts[0])),)


def parse_methods(spec: str | Sequence[str], n_draft: int | None = None) -> list[MethodSpec]:
    """'none,lookup:8,tree:16,beam:4x5,peer-pld' -> MethodSpecs. A ':K' suffix sets the draft
    length of chain, lookup, ouroboros, peer-pld and llama.cpp-draft, the node budget of tree, and
    beams x length of beam and redrafter; auto:no-head and auto:no-draft are auto without its draft
    head or its draft model (the other auto: variants: AUTO_VARIANTS); n_draft is the length for
    chain-like methods given without one.
    `none` is put first when missing: it is the reference for speedup and identity."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    available = available_methods()
    out: list[MethodSpec] = []
    for item in items:
        name, colon, k = item.partition(":")
        if name not in available:
            raise ValueError(f"unknown method {name!r}; available: {', '.join(available)}")
        if colon and name in NO_DRAFT_LENGTH:
            raise ValueError(f"method {name!r} takes no ':K' suffix ({item!r})")
        if name in (*TREE_SHAPED, *BEAM_SHAPED) or (name == "auto" and colon):
            out.append(MethodSpec(item, name, None, _shape_options(name, item, k) if colon else ()))
            continue
        if colon and (not k.isdigit() or int(k) < 1):
            raise ValueError(f"draft length in {item!r} must be a positive integer")
        # llama.cpp's own modes keep llama.cpp's defaults unless given a ':K'
        default = None if name in NO_DRAFT_LENGTH or name == LLAMA_CPP_DRAFT else n_draft
        out.append(MethodSpec(item, name, int(k) if colon else default))
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods listed twice: {','.join(labels)}")
    if "none" not in labels:
        out.insert(0, MethodSpec("none", "none", None))
    return out


# -- running -----------------------------------------------------------------------------------


DEFAULT_N_PROMPTS = 5


def suite_prompts(spec: str, n: int | None = None) -> tuple[str, list["Prompt"]]:
    """The suite's label and prompts for `spec`: SUITE (its first n prompts) or SUITE[A:B] (the
    first n of prompts A..B-1, e.g. prompts a draft head was not trained on). n None: all of a
    closed slice SUITE[A:B], else DEFAULT_N_PROMPTS."""
    from ..data import load_suite, parse_suite_slice, slice_of

    name, start, stop = parse_suite_slice(spec)
    if n is None:
        n = stop - start if stop is not None else DEFAULT_N_PROMPTS
    stop = start + n if stop is None else min(stop, start + n)
    return (spec.strip() if "[" in spec else name), slice_of(spec, load_suite(name, stop), start, stop)


def _as_messages(prompt: BenchPrompt) -> tuple[str, list[dict]]:
    if isinstance(prompt, str):
        return "", [{"role": "user", "content": prompt}]
    if hasattr(prompt, "messages"):
        return str(prompt.id), list(prompt.messages)  # type: ignore[union-attr]
    return "", list(prompt)


def _top2_gap(engine: "Engine", tokens: list[int], row: "np.ndarray | None" = None) -> float:
    """The target's top-2 logit gap after tokens (evaluated in one batch); row: that evaluation's
    logits when the caller has them already."""
    import numpy as np

    top = np.sort(engine.evaluate(tokens)[0] if row is None else row)[-2:]
    return float(top[1] - top[0])


def _top2_gap_one_token(engine: "Engine", tokens: list[int]) -> float:
    """_top2_gap with the context evaluated one token at a time (a second engine on the same
    target and settings with a batch of 1, loaded for this and closed): the numerics of plain
    decoding, where the batched evaluation's may put the two best tokens further apart."""
    from ..engine import Engine

    with Engine(engine.target_path, **engine.target_settings(), n_batch=1, prefix_cache=False, head=False) as one:
        return _top2_gap(one, tokens)


def decode_tokens_per_second(stats: "GenerationStats", finish_reason: str) -> float:
    """A pyspec run's decode rate counted as llama.cpp's tools count theirs: the tokens the target
    produced after the prompt per second of generation, the end token included when one ended the
    generation. The engine decodes the last prompt token in its first step and the last generated
    token in a step that produces the end token; llama-completion decodes the last prompt token
    in its prompt pass and counts one decode per token, llama-speculative-simple counts the end
    token. Without it a run that stops after n tokens would be charged n + 1 steps for n tokens.
    The bench passes no stop strings, so "stop" means the end token."""
    t = stats.t_total_ms - stats.t_prefill_ms
    n = stats.n_generated + (1 if finish_reason == "stop" else 0)
    return 1000.0 * n / t if t > 0 else 0.0


def _run_pyspec(engine: "Engine", m: MethodSpec, prompt_id: str, prompt_tokens: list[int],
                max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> PromptRun:
    t0 = time.perf_counter()
    r = engine.generate(prompt_tokens, max_tokens=max_tokens, method=m.name, n_draft=m.n_draft,
                        temperature=temperature, seed=seed, **dict(m.options))
    wall = time.perf_counter() - t0
    s = r.stats
    decode_rate = decode_tokens_per_second(s, r.finish_reason)
    return PromptRun(
        prompt_id, m.label, len(prompt_tokens), s.n_generated, wall, s.n_generated / wall if wall else 0.0,
        r.finish_reason, list(r.tokens), decode_tokens_per_second=decode_rate,
        decode_tokens_per_second_within_limit=decode_rate,  # the engine never passes max_tokens
        n_target_calls=s.n_target_calls, n_drafted=s.n_drafted, n_accepted=s.n_accepted,
        t_draft_ms=s.t_draft_ms, t_verify_ms=s.t_verify_ms, t_total_ms=s.t_total_ms,
        n_empty_drafts=s.n_empty_drafts, n_draft_decodes=s.n_draft_decodes,
        n_head_drafts=s.n_head_drafts, n_head_accepted=s.n_head_accepted,
    )


def _llama_cpp_tools(specs: list[MethodSpec], bin_dir: str | None) -> tuple[Path | None, dict[str, str]]:
    """The tools' directory, or None and why each llama.cpp peer is skipped."""
    from .llamacpp import LlamaCppToolsMissing, find_tools

    wanted = [m.label for m in specs if m.is_llama_cpp]
    if not wanted:
        return None, {}
    try:
        return find_tools(bin_dir), {}
    except LlamaCppToolsMissing as e:
        log.warning("skipping %s: %s", ", ".join(wanted), e)
        return None, {label: str(e) for label in wanted}


def run_bench(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    prompts: str | Sequence[BenchPrompt] = "humaneval",
    *,
    n: int | None = None,
    max_tokens: int = 128,
    methods: str | Sequence[str] = "none,auto,chain,lookup,peer-pld",
    n_draft: int | None = None,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    warmup: bool = True,
    progress: bool = True,
    llama_cpp_bin: str | None = None,
    n_gpu_layers: int | None = None,
    head: str | None = None,
    repack: bool | str | None = None,
    huge_pages: bool = True,
    ngram: str | None = None,
    settle_s: float | None = None,
    repeats: int = 1,
    flash_attn: bool | str | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
) -> BenchReport:
    """Runs every method on the same prompts, interleaved per prompt, greedy by default.

    prompts: a suite name (`pyspec data list`; its first n prompts, 5 by default), a slice of
    one ('humaneval[156:164]': the first n of those prompts, all of them by default) or a list of prompts
    (data.Prompt, chat messages, or plain strings taken as one user message).
    methods: names with an optional ':K' suffix (see parse_methods). llama.cpp's tools are looked
    for in llama_cpp_bin, else as `pyspec.bench.llamacpp.find_tools` does; when they are not built, their
    methods are skipped (BenchReport.skipped says why and how to build them). n_gpu_layers: as
    Engine's, for every method (llama.cpp's tools get the engine's value). head: a draft head GGUF
    for the engine (method redrafter needs one; auto then weighs it too, auto:no-head does not).
    repack, huge_pages: as Engine's; llama.cpp's tools repack when the engine does (and their
    build allows it) and get glibc's huge pages when the engine asks for them. flash_attn: as
    Engine's, for every method; llama.cpp's tools run the engine's setting when it is forced
    and their own default (`-fa auto`) when the engine decides by measurement ("auto"), as each
    side runs for a user who sets nothing; llama-cpp-python's peers run the engine's setting. ngram: as Engine's
    (an n-gram table auto also drafts from; auto:no-corpus leaves it out).
    settle_s: a pause before every timed run, of every method alike (None: SETTLE_S when
    llama.cpp's tools run, else 0). A tool process that exits slows whatever runs about two
    seconds later (measured: 3-4 one-token steps 20-50 ms slower, 2.0-2.3 s after the exit);
    without the pause the run that follows a tool pays for it, with it no run does.
    repeats: runs of every method per prompt (the rotation goes on between them); the run with the
    median decode tok/s is kept (the lower middle one for an even count), its speeds of every run
    in PromptRun.repeat_decode_tokens_per_second, their step counts in repeat_n_target_calls,
    repeat_n_drafted and repeat_n_accepted. Each repeat of a pyspec method starts from the phrase
    pool it had before the prompt (never from its own earlier answer to it), and each repeat from
    what auto had learnt before the prompt (acceptance statistics, cost corrections); the kept
    run's pool goes on to the next prompt, and what the last repeat learnt. The median damps one
    slow or fast run, and with it the advantage that "the best llama.cpp mode of each
    prompt" (a maximum over several noisy runs) otherwise takes from noise alone.
    temperature: above 0, every method and peer samples at it (top-k, top-p and min-p off); seed:
    the seed of every sampled run (reproducible outputs; auto then leaves the draft model out, as
    for any seeded sampled request), None: each run draws from its own random stream. Sampled
    outputs differ between methods by design (each draws its own random numbers), so no identity
    with none is checked (PromptRun.identical_to_none is None): the target's distribution is what
    sampled methods keep, tested statistically in
    tests/test_sampling.py and tests/test_auto.py.
    """
    from tqdm import tqdm

    from ..engine import Engine
    from .llamacpp import tools_can_repack
    from .llamacpp_run import ToolSettings, write_prompt
    from ..models import resolve_model

    specs = parse_methods(methods, n_draft)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if settle_s is not None and not settle_s >= 0:
        raise ValueError(f"settle_s must be >= 0 seconds, got {settle_s}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    sampled = temperature > 0
    if isinstance(prompts, str):
        suite, prompt_list = suite_prompts(prompts, n)
    else:
        suite, prompt_list = "custom", list(prompts)
    if not prompt_list:
        raise ValueError("no prompts to run")
    needs_draft = [m.label for m in specs if m.name in (*METHODS_NEEDING_DRAFT, LLAMA_CPP_DRAFT)]
    if needs_draft and not draft:
        raise ValueError(f"method(s) {', '.join(needs_draft)} need a draft model (--draft)")
    needs_head = [m.label for m in specs if m.name in METHODS_NEEDING_HEAD]
    if needs_head and not head:
        raise ValueError(f"method(s) {', '.join(needs_head)} need a draft head (--head)")
    if head and not os.path.isfile(head):
        raise FileNotFoundError(f"draft head {head!r} does not exist")
    bin_dir, skipped = _llama_cpp_tools(specs, llama_cpp_bin)
    specs = [m for m in specs if m.label not in skipped]
    uses_draft = any(m.name in (*METHODS_NEEDING_DRAFT, LLAMA_CPP_DRAFT) for m in specs) or (
        bool(draft) and any(m.name == "auto" for m in specs))
    target_path = resolve_model(target, progress=progress)
    draft_path = resolve_model(draft, progress=progress) if uses_draft and draft else None

    with contextlib.ExitStack() as stack:
        # No prefix cache: every method reads its prompt itself, as every peer does (with it, a
        # pyspec method that runs after another one on the same prompt would skip its prompt
        # processing and flatter its wall-time tok/s).
        engine = stack.enter_context(Engine(target_path, draft=draft_path, n_ctx=n_ctx, n_batch=ENGINE_N_BATCH,
                                            n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                                            prefix_cache=False, head=head or False, repack=repack,
                                            huge_pages=huge_pages, ngram=ngram, flash_attn=flash_attn))
        if any(m.name == "auto" for m in specs):
            engine.calibrate(progress=progress)  # cached curves, or measured now: not in the timings
        work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pyspec-bench-")))
        inputs = []  # (prompt id, prompt tokens, prompt file for llama.cpp's tools)
        for i, p in enumerate(prompt_list):
            pid, messages = _as_messages(p)
            text = engine.apply_chat_template(messages)
            inputs.append((pid or f"{suite}/{i}", engine.tokenize(text), write_prompt(work_dir / f"prompt{i}.txt", text)))
        # llama-cpp-python keeps a [n_ctx, n_vocab] float32 logits array when a draft model is
        # set (2.5 GB for Qwen at 4096): size its context to what the prompts need.
        peer_ctx = min(n_ctx, max(len(t) for _, t, _ in inputs) + max_tokens + 64)
        tools_repack = bool(engine.repack and bin_dir is not None and tools_can_repack(bin_dir))
        if engine.repack and bin_dir is not None and not tools_repack:
            log.warning("the llama.cpp tools in %s were built with AMX and must run with repacking off here, "
                        "while pyspec repacks its weights: the comparison is not at equal settings. "
                        "Build them without AMX: python benchmarks/build_llama_cpp.py", bin_dir)
        tool_settings = ToolSettings(model=target_path, n_ctx=n_ctx, n_threads=engine.n_threads, repack=tools_repack,
                                     flash_attn="auto" if engine.flash_attn_mode == "auto" else engine.flash_attn,
                                     n_ubatch=ENGINE_N_BATCH, n_gpu_layers=engine.n_gpu_layers,
                                     huge_pages=engine.huge_pages, temperature=temperature, seed=seed)
        python_peers: dict[str, PythonPeer] = {}
        tool_peers: dict[str, LlamaCppPeer] = {}
        for m in specs:
            if m.name in PYTHON_PEERS:
                python_peers[m.label] = PythonPeer(target_path, n_ctx=peer_ctx, n_threads=engine.n_threads,
                                                   repack=engine.repack_mode == "all", n_draft=m.n_draft,
                                                   pld=m.name == "peer-pld", flash_attn=engine.flash_attn,
                                                   temperature=temperature, seed=seed)
                stack.callback(python_peers[m.label].close)
            elif m.is_llama_cpp:
                assert bin_dir is not None
                tool_peers[m.label] = LlamaCppPeer(m.name, bin_dir, tool_settings, draft=draft_path, n_draft=m.n_draft)

        # The phrase pool learns from every request. Each method keeps a pool of its own across
        # the prompts (saved and restored around its runs), so a method never sees phrases of
        # another method's answer to the same prompt; history reuse stays within a method, as
        # for an engine serving a stream of requests with one method.
        pool_files: dict[str, str] = {}

        pause = settle_s if settle_s is not None else (SETTLE_S if tool_peers else 0.0)

        def run(m: MethodSpec, pid: str, tokens: list[int], prompt_file: Path, limit: int) -> PromptRun:
            time.sleep(pause)
            if m.label in python_peers:
                return python_peers[m.label].run(m.label, pid, tokens, limit)
            if m.label in tool_peers:
                return tool_peers[m.label].run(m.label, pid, prompt_file, len(tokens), limit)
            pool_file = pool_files.setdefault(m.label, str(work_dir / f"method{len(pool_files)}.pool"))
            if os.path.exists(pool_file):
                engine.load_pool(pool_file)
            else:
                engine.clear_pool()
            result = _run_pyspec(engine, m, pid, tokens, limit, temperature, seed)
            engine.save_pool(pool_file)
            return result

        if warmup:  # page the weights in and settle every code path once
            for m in specs:
                run(m, *inputs[0], min(WARMUP_TOKENS, max_tokens))
            for path in pool_files.values():  # forget the warm-up's phrases
                os.remove(path)

        runs: dict[str, list[PromptRun]] = {m.label: [] for m in specs}
        bar = tqdm(total=len(inputs) * len(specs) * repeats, desc="bench", unit="run", file=sys.stderr,
                   disable=not progress)
        with bar:
            for i, (pid, tokens, prompt_file) in enumerate(inputs):
                tries: dict[str, list[PromptRun]] = {m.label: [] for m in specs}
                pools_after: dict[str, list[str]] = {m.label: [] for m in specs}
                before = {label: _snapshot(path) for label, path in pool_files.items()} if repeats > 1 else {}
                learnt = engine._core.learnt() if repeats > 1 else None
                for r in range(repeats):
                    if r > 0:  # auto's statistics and cost corrections as they were before the prompt
                        engine._core.restore_learnt(learnt)
                    # The order rotates by one method per prompt and repeat: no method always runs
                    # in the same slot (first after the previous prompt's last run, or right after
                    # a tool process has exited and released its memory).
                    shift = (i * repeats + r) % len(specs)
                    for m in specs[shift:] + specs[:shift]:
                        bar.set_postfix_str(f"{pid} {m.label}" + (f" {r + 1}/{repeats}" if repeats > 1 else ""),
                                            refresh=False)
                        if r > 0 and m.label in pool_files:
                            _restore(before.get(m.label), pool_files[m.label])
                        tries[m.label].append(run(m, pid, tokens, prompt_file, max_tokens))
                        if m.label in pool_files and repeats > 1:
                            pools_after[m.label].append(_snapshot(pool_files[m.label], f".after{r}"))
                        bar.update(1)
                for m in specs:
                    k, kept = median_run(tries[m.label])
                    runs[m.label].append(kept)
                    if pools_after[m.label]:
                        _restore(pools_after[m.label][k], pool_files[m.label])
                if sampled:
                    for m in specs:
                        runs[m.label][-1].identical_to_none = None
                    continue
                ref = runs["none"][-1]
                gaps: dict[int, tuple[float, float | None]] = {}  # methods leaving none at one token share its gaps
                for m in specs:
                    if m.label in tool_peers:
                        _mark_text_divergence(engine, runs[m.label][-1], ref, tokens,
                                              tool_peers[m.label].renders_special_tokens, gaps)
                    else:
                        _mark_divergence(engine, runs[m.label][-1], ref, tokens, gaps)

    return _report(specs, runs, skipped, target=str(target), draft=str(draft) if uses_draft else None, suite=suite,
                   max_tokens=max_tokens, threads=engine.n_threads, repack=engine.repack_mode,
                   llama_cpp_repack=tools_repack if tool_peers else None, head=os.path.basename(head) if head else None,
                   huge_pages=engine.huge_pages, ngram=os.path.basename(engine.ngram_path) if engine.ngram_path else None,
                   settle_s=pause, repeats=repeats, flash_attn=engine.flash_attn, temperature=temperature,
                   seed=seed if sampled else None,
                   llama_cpp_flash_attn=tool_settings.flash_attn if tool_peers and engine.flash_attn_mode == "auto"
                   else None)


def _snapshot(path: str, suffix: str = ".before") -> str | None:
    """A copy of a method's pool file beside it (None when the method has none yet)."""
    if not os.path.exists(path):
        return None
    shutil.copyfile(path, path + suffix)
    return path + suffix


def _restore(snapshot: str | None, path: str) -> None:
    if snapshot is None:
        if os.path.exists(path):
            os.remove(path)
    else:
        shutil.copyfile(snapshot, path)


def median_run(tries: list[PromptRun]) -> tuple[int, PromptRun]:
    """The index and record of the run with the median decode tok/s (wall tok/s where there is
    none), the lower middle one of an even count; with more than one, every run's figure and step
    counts go along with it."""
    def rate(x: PromptRun) -> float:
        return x.decode_tokens_per_second if x.decode_tokens_per_second is not None else x.tokens_per_second
    if len(tries) == 1:
        return 0, tries[0]
    k = sorted(range(len(tries)), key=lambda j: rate(tries[j]))[(len(tries) - 1) // 2]
    return k, replace(tries[k], repeat_decode_tokens_per_second=[rate(x) for x in tries],
                      repeat_n_target_calls=[x.n_target_calls for x in tries],
                      repeat_n_drafted=[x.n_drafted for x in tries], repeat_n_accepted=[x.n_accepted for x in tries])


def _report(specs: list[MethodSpec], runs: dict[str, list[PromptRun]], skipped: dict[str, str], *, target: str,
            draft: str | None, suite: str, max_tokens: int, threads: int, repack: bool | str,
            llama_cpp_repack: bool | None = None, head: str | None = None,
            huge_pages: bool | None = None, ngram: str | None = None, settle_s: float | None = None,
            repeats: int = 1, flash_attn: bool = False, temperature: float = 0.0,
            seed: int | None = None, llama_cpp_flash_attn: str | None = None) -> BenchReport:
    peers = [m.label for m in specs if m.is_peer]
    modes = [m.label for m in specs if m.is_llama_cpp]
    results = [summarize(m.label, m.n_draft if m.n_draft is not None else _default_n_draft(m.name), m.is_peer,
                         runs[m.label], runs, peers, modes) for m in specs]
    by_label = {r.method: r for r in results}
    best = best_llama_cpp_runs(runs, modes)
    suite_mode, auto_vs_suite_mode = (versus_best_suite_llama_cpp(runs["auto"], runs, modes) if "auto" in runs
                                      else (None, None))
    return BenchReport(
        target=target, draft=draft, suite=suite, n=len(runs["none"]), max_tokens=max_tokens, threads=threads,
        repack=repack, llama_cpp_repack=llama_cpp_repack, huge_pages=huge_pages, flash_attn=flash_attn,
        llama_cpp_flash_attn=llama_cpp_flash_attn, methods=[m.label for m in specs], results=results, skipped=skipped, llama_cpp_modes=modes,
        best_llama_cpp_mode={x.prompt_id: x.method for x in best if x is not None},
        auto_vs_best_llama_cpp=by_label["auto"].decode_speedup_vs_best_llama_cpp if "auto" in by_label else None,
        auto_vs_best_llama_cpp_within_limit=(versus_best_llama_cpp(runs["auto"], runs, modes, decode_within_limit)
                                             if "auto" in runs else None),
        none_vs_llama_cpp=by_label["none"].decode_speedup_vs_llama_cpp,
        best_suite_llama_cpp_mode=suite_mode,
        auto_vs_best_suite_llama_cpp=auto_vs_suite_mode,
        auto_vs_best_llama_cpp_interval=(ratio_interval(runs["auto"], [runs[m] for m in modes])
                                         if "auto" in runs and modes else None),
        none_vs_llama_cpp_interval=ratio_interval(runs["none"], [runs["llama.cpp"]]) if "llama.cpp" in runs else None,
        auto_vs_best_suite_llama_cpp_interval=(ratio_interval(runs["auto"], [runs[suite_mode]])
                                               if "auto" in runs and suite_mode else None),
        head=head, ngram=ngram, settle_s=settle_s,
        repeats=repeats, temperature=temperature, seed=seed,
    )  # fmt: skip


def _divergence(run: PromptRun, ref: PromptRun, engine: "Engine", prompt_tokens: list[int], index: int,
                gaps: dict[int, tuple[float, float | None]], row: "np.ndarray | None" = None) -> None:
    """Marks run as leaving none's output at token index, with the target's top-2 gaps there.
    gaps: the gaps already measured for this prompt, by index (several methods often leave none at
    the same near-tie, and the one-token evaluation of a long context takes minutes). row: the
    target's logits at index (the context evaluated in one batch) when the caller has them."""
    run.identical_to_none = False
    run.divergence_index = index
    if index not in gaps:
        context = prompt_tokens + ref.tokens[:index]
        batched = _top2_gap(engine, context, row)
        gaps[index] = (batched, _top2_gap_one_token(engine, context) if batched >= NEAR_TIE else None)
    run.top2_logit_gap, run.top2_logit_gap_one_token = gaps[index]
    log.info("%s %s: diverges from none at token %d, top-2 logit gap %.3f (one token at a time: %s)", run.prompt_id,
             run.method, index, run.top2_logit_gap,
             "-" if run.top2_logit_gap_one_token is None else f"{run.top2_logit_gap_one_token:.3f}")


def _mark_divergence(engine: "Engine", run: PromptRun, ref: PromptRun, prompt_tokens: list[int],
                     gaps: dict[int, tuple[float, float | None]]) -> None:
    if run.tokens == ref.tokens:
        return
    i = next((k for k, (a, b) in enumerate(zip(run.tokens, ref.tokens)) if a != b),
             min(len(run.tokens), len(ref.tokens)))
    _divergence(run, ref, engine, prompt_tokens, i, gaps)


def _mark_text_divergence(engine: "Engine", run: PromptRun, ref: PromptRun, prompt_tokens: list[int],
                          special: bool, gaps: dict[int, tuple[float, float | None]]) -> None:
    """Identity by text, for tools that print text: the run's bytes against none's tokens rendered
    the way the tool renders them. A run that stopped at the length limit may have generated past
    none's last token (llama-speculative-simple does): then none's text must be its prefix.

    The divergence is placed at none's token that holds the first differing byte, or one token
    earlier where the bytes differ from that token's first byte on and the target's runner-up
    there spells more of the run's text than none's token did (none `)` then ` +`, the tool `))`:
    the tool left at the `)`, whose first byte both share)."""
    import numpy as np

    pieces = [engine.detokenize_bytes([t], special=special) for t in ref.tokens]
    expected = b"".join(pieces)
    out = (run.text or "").encode("utf-8", "surrogateescape")
    if out == expected or (ref.finish_reason == "length" and out.startswith(expected)):
        return
    first = next((k for k, (a, b) in enumerate(zip(out, expected)) if a != b), min(len(out), len(expected)))
    start, index = 0, len(ref.tokens)
    for k, piece in enumerate(pieces):  # none's token that holds the first differing byte
        if start + len(piece) > first:
            index = k
            break
        start += len(piece)
    row = None
    if 0 < index < len(ref.tokens) and first == start:
        previous = start - len(pieces[index - 1])
        logits = engine.evaluate(prompt_tokens + ref.tokens[:index - 1])[0]
        runner_up = next(int(t) for t in np.argsort(logits)[::-1][:2] if t != ref.tokens[index - 1])
        spelled = engine.detokenize_bytes([runner_up], special=special)
        if len(spelled) > len(pieces[index - 1]) and out[previous:].startswith(spelled):
            index, row = index - 1, logits  # its gap is read from this evaluation
    _divergence(run, ref, engine, prompt_tokens, index, gaps, row)


def _default_n_draft(name: str) -> int | None:
    from ..engine import DEFAULT_N_DRAFT

    if name == "peer-pld":
        return PEER_PLD_N_DRAFT
    if name == LLAMA_CPP_DRAFT:
        return LLAMA_CPP_DEFAULT_N_DRAFT
    return DEFAULT_N_DRAFT.get(name)
