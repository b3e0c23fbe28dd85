"""`pyspec bench`: decoding methods side by side on a prompt suite, in one process.

For each prompt every method runs back to back (A B A B ...), so machine drift hits all methods
alike; each method is warmed up first; decoding is greedy through the chat template. Methods that
use the phrase pool keep one pool per method across the prompts (history reuse as in serving; a
method never sees another method's answer to the same prompt). Besides
pyspec's own methods, two peers run on identical prompt tokens with the same threads and greedy
settings: llama-cpp-python's plain generation (`peer-llama-cpp`) and its prompt-lookup
speculative decoding (`peer-pld`, `LlamaPromptLookupDecoding`).

Timing: wall clock around each generation call, prompt processing included, for every method
alike (the peers expose no prefill-free timer); tokens/s = generated tokens / wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

if TYPE_CHECKING:
    from .data import Prompt
    from .engine import Engine

log = logging.getLogger(__name__)

from .config import DEFAULT_DRAFT, DEFAULT_TARGET, METHODS_NEEDING_DRAFT  # noqa: E402

PEER_METHODS = ("peer-llama-cpp", "peer-pld")
PEER_PLD_N_DRAFT = 10  # LlamaPromptLookupDecoding's num_pred_tokens default
TIMING_NOTE = ("tokens/s = generated tokens / wall time of the whole generation call (prompt "
               "processing included), the same for every method")
SPEEDUP_NOTE = "speedups are medians of per-prompt ratios"
WARMUP_TOKENS = 8

BenchPrompt = Union["Prompt", str, Sequence[dict]]


@dataclass(frozen=True)
class MethodSpec:
    label: str  # as given on the command line, e.g. "lookup:8", "tree:24", "beam:4x5"
    name: str  # a pyspec method (engine.METHODS) | "peer-llama-cpp" | "peer-pld"
    n_draft: int | None  # chain-like methods: None = the method's own default
    options: tuple[tuple[str, int], ...] = ()  # tree / beam shape from the suffix, for generate()

    @property
    def is_peer(self) -> bool:
        return self.name in PEER_METHODS


def available_methods() -> tuple[str, ...]:
    from .engine import METHODS

    return (*METHODS, *PEER_METHODS)


def _shape_options(name: str, item: str, k: str) -> tuple[tuple[str, int], ...]:
    """tree:N -> tree_nodes N; beam:KxL -> K beams of length L."""
    parts = k.split("x") if name == "beam" else [k]
    if len(parts) != (2 if name == "beam" else 1) or not all(x.isdigit() and int(x) >= 1 for x in parts):
        form = "beam:KxL (e.g. beam:4x5)" if name == "beam" else "tree:N (node budget, e.g. tree:16)"
        raise ValueError(f"bad shape in {item!r}: expected {form}")
    if name == "beam":
        return (("beams", int(parts[0])), ("beam_length", int(parts[1])))
    return (("tree_nodes", int(parts[0])),)


def parse_methods(spec: str | Sequence[str], n_draft: int | None = None) -> list[MethodSpec]:
    """'none,lookup:8,tree:16,beam:4x5,peer-pld' -> MethodSpecs. A ':K' suffix sets the draft
    length of chain, lookup and peer-pld, the node budget of tree, and beams x length of beam;
    n_draft is the length for chain-like methods given without one. `none` is put first when
    missing: it is the reference for speedup and identity."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    available = available_methods()
    out: list[MethodSpec] = []
    for item in items:
        name, colon, k = item.partition(":")
        if name not in available:
            raise ValueError(f"unknown method {name!r}; available: {', '.join(available)}")
        if colon and name in ("none", "peer-llama-cpp"):
            raise ValueError(f"method {name!r} drafts nothing: a ':K' suffix makes no sense ({item!r})")
        if name in ("tree", "beam"):
            out.append(MethodSpec(item, name, None, _shape_options(name, item, k) if colon else ()))
            continue
        if colon and (not k.isdigit() or int(k) < 1):
            raise ValueError(f"draft length in {item!r} must be a positive integer")
        drafts = name not in ("none", "peer-llama-cpp")
        out.append(MethodSpec(item, name, int(k) if colon else (n_draft if drafts else None)))
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods listed twice: {','.join(labels)}")
    if "none" not in labels:
        out.insert(0, MethodSpec("none", "none", None))
    return out


@dataclass
class PromptRun:
    """One (prompt, method) generation."""

    prompt_id: str
    method: str
    n_prompt_tokens: int
    n_generated: int
    wall_s: float
    tokens_per_second: float  # n_generated / wall_s
    finish_reason: str
    tokens: list[int]
    identical_to_none: bool = True
    divergence_index: int | None = None  # first token that differs from none's output
    top2_logit_gap: float | None = None  # target's top-2 logit gap at the divergence
    # pyspec methods only (None for peers):
    engine_tokens_per_second: float | None = None  # pyspec's own figure, prefill excluded
    n_target_calls: int | None = None
    n_drafted: int | None = None
    n_accepted: int | None = None
    t_draft_ms: float | None = None
    t_verify_ms: float | None = None
    t_total_ms: float | None = None
    n_empty_drafts: int | None = None  # target calls that verified no draft (plain decoding steps)
    n_draft_decodes: int | None = None


@dataclass
class MethodSummary:
    method: str
    n_draft: int | None
    tokens_per_second: float  # median over prompts
    tokens_per_second_min: float
    tokens_per_second_max: float
    speedup_vs_none: float  # median of per-prompt ratios
    speedup_vs_peers: dict[str, float]  # peer label -> median of per-prompt ratios
    acceptance_rate: float | None  # pooled: accepted / drafted; None for none and peers
    tokens_per_target_call: float | None  # pooled; None for peers
    draft_time_share: float | None  # draft time / generation time, pooled; None for peers
    verify_time_share: float | None
    plain_step_share: float | None  # target calls with no draft / all target calls, pooled
    greedy_identical: int  # prompts whose output equals none's
    n_prompts: int
    per_prompt: list[PromptRun] = field(default_factory=list)


@dataclass
class BenchReport:
    target: str
    draft: str | None
    suite: str
    n: int
    max_tokens: int
    threads: int
    repack: bool
    methods: list[str]
    results: list[MethodSummary]
    timing: str = TIMING_NOTE
    speedup: str = SPEEDUP_NOTE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- running -----------------------------------------------------------------------------------


class _Peer:
    """A llama-cpp-python model generating greedily from token ids."""

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, repack: bool, n_draft: int | None,
                 pld: bool) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft_model = LlamaPromptLookupDecoding(num_pred_tokens=n_draft or PEER_PLD_N_DRAFT) if pld else None
        # Llama builds its model params from llama_cpp.llama_model_default_params() inside
        # __init__ and loads the model right away, with no parameter for use_extra_bufts. When
        # pyspec runs with repacking off (AMX CPUs, whose AMX extra-buffer kernels crash with
        # SIGILL), the peer must too: swap that one function for the duration of the
        # constructor, so the defaults it returns carry use_extra_bufts = False.
        with _model_defaults(use_extra_bufts=repack):
            self.llm = llama_cpp.Llama(
                model_path=model_path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=n_threads,
                n_threads_batch=n_threads, flash_attn=False, draft_model=draft_model, verbose=False,
            )
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._is_eog = lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))

    def generate(self, prompt_tokens: list[int], max_tokens: int) -> tuple[list[int], str]:
        """Greedy tokens after prompt_tokens, without the end-of-generation token (as pyspec)."""
        self.llm.reset()  # evaluate the whole prompt every time, as pyspec does
        tokens: list[int] = []
        gen = self.llm.generate(prompt_tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        try:
            for token in gen:
                if self._is_eog(token):
                    return tokens, "stop"
                tokens.append(int(token))
                if len(tokens) >= max_tokens:
                    return tokens, "length"
        finally:
            gen.close()
        return tokens, "stop"

    def close(self) -> None:
        self.llm.close()


@contextlib.contextmanager
def _model_defaults(*, use_extra_bufts: bool) -> Iterator[None]:
    import llama_cpp.llama_cpp as lib

    if use_extra_bufts:
        yield
        return
    original = lib.llama_model_default_params

    def defaults() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = defaults
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def _as_messages(prompt: BenchPrompt) -> tuple[str, list[dict]]:
    if isinstance(prompt, str):
        return "", [{"role": "user", "content": prompt}]
    if hasattr(prompt, "messages"):
        return str(prompt.id), list(prompt.messages)  # type: ignore[union-attr]
    return "", list(prompt)


def _top2_gap(engine: "Engine", tokens: list[int]) -> float:
    import numpy as np

    top = np.sort(engine.evaluate(tokens)[0])[-2:]
    return float(top[1] - top[0])


def _run_pyspec(engine: "Engine", m: MethodSpec, prompt_id: str, prompt_tokens: list[int],
                max_tokens: int) -> PromptRun:
    t0 = time.perf_counter()
    r = engine.generate(prompt_tokens, max_tokens=max_tokens, method=m.name, n_draft=m.n_draft, **dict(m.options))
    wall = time.perf_counter() - t0
    s = r.stats
    return PromptRun(
        prompt_id, m.label, len(prompt_tokens), s.n_generated, wall, s.n_generated / wall if wall else 0.0,
        r.finish_reason, list(r.tokens), engine_tokens_per_second=s.tokens_per_second,
        n_target_calls=s.n_target_calls, n_drafted=s.n_drafted, n_accepted=s.n_accepted,
        t_draft_ms=s.t_draft_ms, t_verify_ms=s.t_verify_ms, t_total_ms=s.t_total_ms,
        n_empty_drafts=s.n_empty_drafts, n_draft_decodes=s.n_draft_decodes,
    )


def _run_peer(peer: _Peer, m: MethodSpec, prompt_id: str, prompt_tokens: list[int], max_tokens: int) -> PromptRun:
    t0 = time.perf_counter()
    tokens, finish = peer.generate(prompt_tokens, max_tokens)
    wall = time.perf_counter() - t0
    return PromptRun(prompt_id, m.label, len(prompt_tokens), len(tokens), wall,
                     len(tokens) / wall if wall else 0.0, finish, tokens)


def run_bench(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    prompts: str | Sequence[BenchPrompt] = "humaneval",
    *,
    n: int = 5,
    max_tokens: int = 128,
    methods: str | Sequence[str] = "none,auto,chain,lookup,peer-pld",
    n_draft: int | None = None,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    warmup: bool = True,
    progress: bool = True,
) -> BenchReport:
    """Runs every method on the same prompts, interleaved per prompt, greedy.

    prompts: a suite name (`pyspec data list`; its first n prompts) or a list of prompts
    (data.Prompt, chat messages, or plain strings taken as one user message).
    methods: names with an optional ':K' draft length (see parse_methods).
    """
    from tqdm import tqdm

    from .engine import Engine
    from .models import resolve_model

    specs = parse_methods(methods, n_draft)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if isinstance(prompts, str):
        from .data import load_suite

        suite, prompt_list = prompts, list(load_suite(prompts, n=n))
    else:
        suite, prompt_list = "custom", list(prompts)
    if not prompt_list:
        raise ValueError("no prompts to run")
    needs_draft = [m.label for m in specs if m.name in METHODS_NEEDING_DRAFT]
    if needs_draft and not draft:
        raise ValueError(f"method(s) {', '.join(needs_draft)} need a draft model (--draft)")
    uses_draft = bool(needs_draft) or (bool(draft) and any(m.name == "auto" for m in specs))
    target_path = resolve_model(target, progress=progress)
    draft_path = resolve_model(draft, progress=progress) if uses_draft and draft else None

    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(Engine(target_path, draft=draft_path, n_ctx=n_ctx, n_threads=n_threads))
        if any(m.name == "auto" for m in specs):
            engine.calibrate(progress=progress)  # cached curves, or measured now: not in the timings
        inputs = []
        for i, p in enumerate(prompt_list):
            pid, messages = _as_messages(p)
            inputs.append((pid or f"{suite}/{i}", engine.prompt_tokens(messages)))
        # llama-cpp-python keeps a [n_ctx, n_vocab] float32 logits array when a draft model is
        # set (2.5 GB for Qwen at 4096): size the peers' context to what the prompts need.
        peer_ctx = min(n_ctx, max(len(t) for _, t in inputs) + max_tokens + 64)
        peers: dict[str, _Peer] = {}
        for m in specs:
            if m.is_peer:
                peers[m.label] = _Peer(target_path, n_ctx=peer_ctx, n_threads=engine.n_threads, repack=engine.repack,
                                       n_draft=m.n_draft, pld=m.name == "peer-pld")
                stack.callback(peers[m.label].close)

        # The phrase pool learns from every request. Each method keeps a pool of its own across
        # the prompts (saved and restored around its runs), so a method never sees phrases of
        # another method's answer to the same prompt; history reuse stays within a method, as
        # for an engine serving a stream of requests with one method.
        pool_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pyspec-bench-"))

        def run(m: MethodSpec, pid: str, tokens: list[int], limit: int) -> PromptRun:
            if m.is_peer:
                return _run_peer(peers[m.label], m, pid, tokens, limit)
            pool_file = pool_files.setdefault(m.label, os.path.join(pool_dir, f"method{len(pool_files)}.pool"))
            if os.path.exists(pool_file):
                engine.load_pool(pool_file)
            else:
                engine.clear_pool()
            result = _run_pyspec(engine, m, pid, tokens, limit)
            engine.save_pool(pool_file)
            return result

        pool_files: dict[str, str] = {}
        if warmup:  # page the weights in and settle every code path once
            for m in specs:
                run(m, inputs[0][0], inputs[0][1], min(WARMUP_TOKENS, max_tokens))
            for path in pool_files.values():  # forget the warm-up's phrases
                os.remove(path)

        runs: dict[str, list[PromptRun]] = {m.label: [] for m in specs}
        bar = tqdm(total=len(inputs) * len(specs), desc="bench", unit="run", file=sys.stderr, disable=not progress)
        with bar:
            for pid, tokens in inputs:
                for m in specs:
                    bar.set_postfix_str(f"{pid} {m.label}", refresh=False)
                    runs[m.label].append(run(m, pid, tokens, max_tokens))
                    bar.update(1)
                ref = runs["none"][-1]
                for m in specs:
                    _mark_divergence(engine, runs[m.label][-1], ref, tokens)

    results = [_summarize(m, runs[m.label], runs["none"], {p: runs[p] for p in peers}) for m in specs]
    return BenchReport(
        target=str(target), draft=str(draft) if uses_draft else None, suite=suite, n=len(inputs),
        max_tokens=max_tokens, threads=engine.n_threads, repack=engine.repack, methods=[m.label for m in specs],
        results=results,
    )


def _mark_divergence(engine: "Engine", run: PromptRun, ref: PromptRun, prompt_tokens: list[int]) -> None:
    if run.tokens == ref.tokens:
        return
    i = next((k for k, (a, b) in enumerate(zip(run.tokens, ref.tokens)) if a != b),
             min(len(run.tokens), len(ref.tokens)))
    run.identical_to_none = False
    run.divergence_index = i
    run.top2_logit_gap = _top2_gap(engine, prompt_tokens + ref.tokens[:i])
    log.info("%s %s: diverges from none at token %d, top-2 logit gap %.3f", run.prompt_id, run.method, i,
             run.top2_logit_gap)


def _median_ratio(xs: list[PromptRun], refs: list[PromptRun]) -> float:
    ratios = [x.tokens_per_second / r.tokens_per_second for x, r in zip(xs, refs) if r.tokens_per_second > 0]
    return statistics.median(ratios) if ratios else 0.0


def _summarize(m: MethodSpec, xs: list[PromptRun], none: list[PromptRun],
               peers: dict[str, list[PromptRun]]) -> MethodSummary:
    tps = [x.tokens_per_second for x in xs]
    acceptance = tpc = draft_share = verify_share = plain_share = None
    if not m.is_peer:
        drafted = sum(x.n_drafted or 0 for x in xs)
        acceptance = sum(x.n_accepted or 0 for x in xs) / drafted if drafted else None
        calls = sum(x.n_target_calls or 0 for x in xs)
        tpc = sum(x.n_generated for x in xs) / calls if calls else None
        plain_share = sum(x.n_empty_drafts or 0 for x in xs) / calls if calls else None
        total = sum(x.t_total_ms or 0.0 for x in xs)
        draft_share = sum(x.t_draft_ms or 0.0 for x in xs) / total if total else None
        verify_share = sum(x.t_verify_ms or 0.0 for x in xs) / total if total else None
    return MethodSummary(
        method=m.label, n_draft=m.n_draft if m.n_draft is not None else _default_n_draft(m.name),
        tokens_per_second=statistics.median(tps), tokens_per_second_min=min(tps), tokens_per_second_max=max(tps),
        speedup_vs_none=_median_ratio(xs, none),
        speedup_vs_peers={p: _median_ratio(xs, refs) for p, refs in peers.items()},
        acceptance_rate=acceptance, tokens_per_target_call=tpc, draft_time_share=draft_share,
        verify_time_share=verify_share, plain_step_share=plain_share, greedy_identical=sum(x.identical_to_none for x in xs), n_prompts=len(xs),
        per_prompt=xs,
    )


def _default_n_draft(name: str) -> int | None:
    from .engine import DEFAULT_N_DRAFT

    return PEER_PLD_N_DRAFT if name == "peer-pld" else DEFAULT_N_DRAFT.get(name)


# -- output ------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_markdown(report: BenchReport) -> str:
    peers = [r.method for r in report.results if r.method.split(":")[0] in PEER_METHODS]
    lines = [
        f"target {report.target}, draft {report.draft or '-'}, suite {report.suite} ({report.n} prompts), "
        f"greedy, chat template, {report.max_tokens} new tokens at most, {report.threads} threads, "
        f"repack {'on' if report.repack else 'off'}",
        f"{report.timing}; {report.speedup}; tok/s is the median (min-max) over prompts.",
        "",
        "| method | n_draft | tok/s | speedup vs none | " + "".join(f"speedup vs {p} | " for p in peers)
        + "acceptance | tokens/target call | plain steps | draft / verify time | identical to none |",
        "|---|---|---|---|" + "---|" * len(peers) + "---|---|---|---|---|",
    ]
    for r in report.results:
        split = ("-" if r.draft_time_share is None
                 else f"{100 * r.draft_time_share:.0f}% / {100 * (r.verify_time_share or 0.0):.0f}%")
        lines.append(
            f"| {r.method} | {_fmt(r.n_draft, 'd')} | {r.tokens_per_second:.1f} ({r.tokens_per_second_min:.1f}-"
            f"{r.tokens_per_second_max:.1f}) | {r.speedup_vs_none:.2f}x | "
            + "".join(f"{r.speedup_vs_peers[p]:.2f}x | " for p in peers)
            + f"{_fmt(r.acceptance_rate)} | {_fmt(r.tokens_per_target_call)} | "
            f"{'-' if r.plain_step_share is None else f'{100 * r.plain_step_share:.0f}%'} | {split} | "
            f"{r.greedy_identical}/{r.n_prompts} |"
        )
    divergences = [x for r in report.results for x in r.per_prompt if not x.identical_to_none]
    if divergences:
        lines += ["", "Divergences from none (a small top-2 logit gap is a near-tie, not a verification error):"]
        lines += [f"- {x.method} {x.prompt_id}: first differs at token {x.divergence_index}, "
                  f"top-2 logit gap {_fmt(x.top2_logit_gap, '.3f')}" for x in divergences]
    return "\n".join(lines)


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")


def plot(report: BenchReport, path: str | Path) -> None:
    """Bar chart of tokens/s per method (median, min-max whiskers) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install matplotlib "
                          "(or pip install 'pyspec-engine[bench]')") from None
    names = [r.method for r in report.results]
    med = [r.tokens_per_second for r in report.results]
    err = [[m - r.tokens_per_second_min for m, r in zip(med, report.results)],
           [r.tokens_per_second_max - m for m, r in zip(med, report.results)]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names)), 3.5))
    try:
        ax.bar(names, med, yerr=err, capsize=4, color=["#888" if n == "none" else "#3a7" for n in names])
        ax.set_ylabel("tokens/s (median, min-max)")
        ax.set_title(f"{report.suite}, {report.n} prompts, {report.max_tokens} tokens, {report.threads} threads",
                     fontsize=9)
        ax.tick_params(axis="x", labelrotation=20)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


# -- command line ------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # fail before the long run
        print("pyspec: error: --plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 1
    report = run_bench(
        args.target, args.draft, args.prompt or args.suite, n=args.n, max_tokens=args.max_tokens, methods=args.methods,
        n_draft=args.n_draft, n_threads=args.threads, progress=not args.no_progress,
    )
    print(format_markdown(report))
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmark decoding methods and llama-cpp-python peers side by side")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"registry name or GGUF path (default {DEFAULT_DRAFT})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--suite", default="humaneval", help="prompt suite: humaneval, edit, mtbench, gsm8k, sharegpt")
    src.add_argument("--prompt", action="append", default=None,
                     help="a prompt (one user message) instead of a suite; repeatable")
    p.add_argument("--n", type=int, default=5, help="prompts from the suite (default 5)")
    p.add_argument("--max-tokens", type=int, default=128, help="most new tokens per prompt (default 128)")
    p.add_argument("--methods", default="none,auto,chain,lookup,peer-pld",
                   help="comma-separated; chain, lookup, ouroboros and peer-pld take an optional :K draft "
                        "length, tree:N a node budget, beam:KxL beams x length; available: auto, none, chain, "
                        "tree, beam, lookup, ouroboros, peer-llama-cpp, peer-pld "
                        "(default none,auto,chain,lookup,peer-pld)")
    p.add_argument("--n-draft", type=int, default=None,
                   help="draft length for methods without :K (default: chain 4, lookup 8, peer-pld 10)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every method (default: all cores)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--plot", default=None, metavar="PATH", help="also write a PNG bar chart (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=_cmd_bench)
