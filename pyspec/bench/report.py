"""`pyspec bench` results: per-run records, per-method summaries, the comparison with llama.cpp's
own tools, and their renderings (markdown, JSON, PNG)."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

TIMING_NOTE = ("tok/s = generated tokens / wall time of the generation with prompt processing (pyspec and "
               "llama-cpp-python: the whole call; llama.cpp tools: their own prompt + generation timers, "
               "model load excluded)")
DECODE_NOTE = ("decode tok/s leaves prompt processing out: pyspec's generated tokens, plus the end token when one "
               "ended the generation, per second of generation (as the tools count: llama-completion decodes the "
               "last prompt token in its prompt pass, llama-speculative-simple counts the end token), "
               "llama-completion's `eval time` line (time inside its one-token decodes), "
               "llama-speculative-simple's `decoded ... speed` line (wall time of its speculative loop); "
               "llama-cpp-python peers have none")
SPEEDUP_NOTE = "speedups are medians of per-prompt ratios"
IDENTITY_NOTE = ("identical to none: same token ids (pyspec methods, llama-cpp-python peers) or same "
                 "generated text (llama.cpp tools, which print text, not ids)")
BEST_MODE_NOTE = "best llama.cpp mode: the llama.cpp peer with the highest decode tok/s on each prompt, plain included"
INTERVAL_NOTE = ("in brackets after a ratio: its 95% bootstrap interval, the range the median of per-prompt ratios "
                 "takes when the prompts are resampled, and each prompt's runs where it ran more than once "
                 "(2,000 resamples, seeded): how far this machine's run-to-run noise leaves the figure uncertain")
SUITE_MODE_NOTE = ("the suite's best llama.cpp mode: the one llama.cpp peer with the highest median decode tok/s over "
                   "the suite, the mode a user would configure for such work")


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
    tokens: list[int]  # empty for llama.cpp tools (they print text)
    identical_to_none: bool | None = True  # None: a sampled run (bench.run_bench's temperature)
    divergence_index: int | None = None  # first token of none's output that differs
    top2_logit_gap: float | None = None  # target's top-2 logit gap at the divergence (context in one batch)
    # The same gap with the context evaluated one token at a time, as plain decoding does; only
    # where the batched gap is not a near-tie (bench.NEAR_TIE): the two evaluations' logits differ
    # (docs/numerics.md), so a flip can sit on a near-tie in one and not in the other.
    top2_logit_gap_one_token: float | None = None
    # Prompt processing excluded: pyspec's own figure or the llama.cpp tool's (DECODE_NOTE);
    # None for llama-cpp-python peers.
    decode_tokens_per_second: float | None = None
    # The same up to the token limit: differs for llama-speculative-simple only, whose last step
    # may run past it (llamacpp_run.ToolRun); None for llama-cpp-python peers.
    decode_tokens_per_second_within_limit: float | None = None
    n_drafted: int | None = None  # pyspec methods and llama-speculative-simple
    n_accepted: int | None = None
    # pyspec methods only (None for peers):
    n_target_calls: int | None = None
    t_draft_ms: float | None = None
    t_verify_ms: float | None = None
    t_total_ms: float | None = None
    n_empty_drafts: int | None = None  # target calls that verified no draft (plain decoding steps)
    n_draft_decodes: int | None = None
    n_head_drafts: int | None = None  # pyspec methods: steps that verified a draft head's chain
    n_head_accepted: int | None = None  # and its tokens accepted
    # llama.cpp tools only:
    text: str | None = None  # generated text (undecodable bytes as surrogate escapes)
    process_wall_s: float | None = None  # the tool's whole process, model load included
    # With bench's repeats > 1: decode tok/s (wall tok/s for peers without one) of every run of
    # this (prompt, method), in run order; this record is the run with the median one.
    repeat_decode_tokens_per_second: list[float] | None = None
    # and, in the same order, each run's target calls, drafted and accepted tokens (None where the
    # method does not report them): tells a method's plan changing between runs from machine noise.
    repeat_n_target_calls: list[int | None] | None = None
    repeat_n_drafted: list[int | None] | None = None
    repeat_n_accepted: list[int | None] | None = None


@dataclass
class MethodSummary:
    method: str
    n_draft: int | None
    tokens_per_second: float  # median over prompts
    tokens_per_second_min: float
    tokens_per_second_max: float
    speedup_vs_none: float  # median of per-prompt ratios
    speedup_vs_peers: dict[str, float]  # peer label -> median of per-prompt ratios (wall time)
    acceptance_rate: float | None  # pooled: accepted / drafted; None where nothing is counted
    tokens_per_target_call: float | None  # pooled; None for peers
    draft_time_share: float | None  # draft time / generation time, pooled; None for peers
    verify_time_share: float | None
    plain_step_share: float | None  # target calls with no draft / all target calls, pooled
    greedy_identical: int  # prompts whose output equals none's (0 when sampled: not checked)
    n_prompts: int
    decode_tokens_per_second: float | None = None  # median; None when the method has no decode figure
    decode_speedup_vs_none: float | None = None  # median of per-prompt decode ratios
    decode_speedup_vs_llama_cpp: float | None = None  # vs llama.cpp plain (llama-completion)
    decode_speedup_vs_best_llama_cpp: float | None = None  # vs the best llama.cpp mode of each prompt
    per_prompt: list[PromptRun] = field(default_factory=list)


@dataclass
class BenchReport:
    target: str
    draft: str | None
    suite: str
    n: int
    max_tokens: int
    threads: int
    repack: bool | str  # the engine's Engine.repack_mode (True / False in reports written before it)
    methods: list[str]
    results: list[MethodSummary]
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it did not run
    llama_cpp_modes: list[str] = field(default_factory=list)  # llama.cpp peers that ran
    best_llama_cpp_mode: dict[str, str] = field(default_factory=dict)  # prompt id -> fastest llama.cpp peer
    auto_vs_best_llama_cpp: float | None = None  # decode tok/s, median of per-prompt ratios
    # the same with every decode figure taken up to the token limit (PromptRun)
    auto_vs_best_llama_cpp_within_limit: float | None = None
    none_vs_llama_cpp: float | None = None  # none vs llama.cpp plain, decode tok/s, median of ratios
    # The one llama.cpp peer with the highest median decode tok/s over the suite, and auto against
    # it (median of per-prompt ratios): the best of several noisy runs per prompt is biased upwards
    # where the modes all run at about plain speed, the suite's best mode is not (None: older reports).
    best_suite_llama_cpp_mode: str | None = None
    auto_vs_best_suite_llama_cpp: float | None = None
    # 95% bootstrap intervals of the three ratios above ([low, high]; ratio_interval; None where the
    # ratio is, or the report is older than the field)
    auto_vs_best_llama_cpp_interval: list[float] | None = None
    none_vs_llama_cpp_interval: list[float] | None = None
    auto_vs_best_suite_llama_cpp_interval: list[float] | None = None
    head: str | None = None  # the engine's draft head, when given
    llama_cpp_repack: bool | None = None  # whether llama.cpp's tools ran with weight repacking (None: no tools ran)
    huge_pages: bool | None = None  # Engine.huge_pages, which the tools' GLIBC_TUNABLES follow (None: older reports)
    ngram: str | None = None  # the engine's n-gram table (file name), when given
    settle_s: float | None = None  # the pause before each run (None: older reports, which had none)
    repeats: int = 1  # runs of each method per prompt; the median one is reported (bench.run_bench)
    flash_attn: bool = False  # Engine.flash_attn (older reports: off, as then always)
    # "auto" where the engine decided its flash attention by measurement and llama.cpp's tools ran
    # their own default (-fa auto); None: every peer ran the engine's setting
    llama_cpp_flash_attn: str | None = None
    temperature: float = 0.0  # 0: greedy (older reports: always); above 0 every method and peer sampled at it
    seed: int | None = None  # the sampling seed of every run (None: greedy, or each run its own stream)
    timing: str = TIMING_NOTE
    decode_timing: str = DECODE_NOTE
    speedup: str = SPEEDUP_NOTE
    identity: str = IDENTITY_NOTE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def result(self, method: str) -> MethodSummary | None:
        return next((r for r in self.results if r.method == method), None)


# -- summaries -----------------------------------------------------------------------------------


def _median_ratio(xs: list[PromptRun], refs: list[float | None], value: Callable[[PromptRun], float | None]
                  ) -> float | None:
    ratios = [v / r for x, r in zip(xs, refs) if (v := value(x)) is not None and r]
    return statistics.median(ratios) if ratios else None


def _wall(x: PromptRun) -> float:
    return x.tokens_per_second


def _decode(x: PromptRun) -> float | None:
    return x.decode_tokens_per_second


def decode_within_limit(x: PromptRun) -> float | None:
    """A run's decode tok/s up to the token limit (for best_llama_cpp_runs, versus_best_llama_cpp)."""
    return x.decode_tokens_per_second_within_limit


def best_llama_cpp_runs(runs: dict[str, list[PromptRun]], modes: list[str],
                        value: Callable[[PromptRun], float | None] = _decode) -> list[PromptRun | None]:
    """Per prompt, the llama.cpp peer run with the highest decode tok/s (None without any)."""
    if not modes:
        return []
    best: list[PromptRun | None] = []
    for per_mode in zip(*(runs[m] for m in modes)):
        timed = [x for x in per_mode if value(x) is not None]
        best.append(max(timed, key=lambda x: value(x) or 0.0) if timed else None)
    return best


def versus_best_llama_cpp(xs: list[PromptRun], runs: dict[str, list[PromptRun]], modes: list[str],
                          value: Callable[[PromptRun], float | None] = _decode) -> float | None:
    """Median over prompts of xs' figure / the best llama.cpp mode's figure on that prompt."""
    best = [value(b) if b else None for b in best_llama_cpp_runs(runs, modes, value)]
    return _median_ratio(xs, best, value) if best else None


def best_suite_llama_cpp_mode(runs: dict[str, list[PromptRun]], modes: list[str],
                              value: Callable[[PromptRun], float | None] = _decode) -> str | None:
    """The llama.cpp peer with the highest median figure over the prompts (None without any timed
    one). A single mode chosen for the whole suite, as a user configures one: unlike the best mode
    of each prompt, not the maximum of several noisy figures per prompt."""
    medians = {m: statistics.median(v) for m in modes
               if (v := [x for r in runs[m] if (x := value(r)) is not None])}
    return max(medians, key=lambda m: medians[m]) if medians else None


def versus_best_suite_llama_cpp(xs: list[PromptRun], runs: dict[str, list[PromptRun]], modes: list[str],
                                value: Callable[[PromptRun], float | None] = _decode
                                ) -> tuple[str | None, float | None]:
    """The suite's best llama.cpp mode (best_suite_llama_cpp_mode) and the median over prompts of
    xs' figure / that mode's figure on the prompt; (None, None) without a timed mode."""
    mode = best_suite_llama_cpp_mode(runs, modes, value)
    if mode is None:
        return None, None
    return mode, _median_ratio(xs, [value(r) for r in runs[mode]], value)


INTERVAL_LEVEL = 0.95
INTERVAL_RESAMPLES = 2000


def _run_figures(x: PromptRun | None) -> list[float]:
    """A prompt's decode tok/s, one per run: every run's where the bench ran it more than once, the
    one run's otherwise; [] without a decode figure."""
    if x is None or x.decode_tokens_per_second is None:
        return []
    return list(x.repeat_decode_tokens_per_second or [x.decode_tokens_per_second])


def ratio_interval(xs: list[PromptRun], refs: list[list[PromptRun]], *, seed: int = 0) -> list[float] | None:
    """The 95% bootstrap interval [low, high] of the median over prompts of xs' decode tok/s / the
    reference's, where a prompt's reference is the fastest of refs' runs lists on it (one list: that
    peer; several: the best mode of each prompt). Each resample draws the prompts with replacement
    and, for every method on a drawn prompt, its runs with replacement, keeping the lower middle run
    as the bench does (runner.median_run). None with fewer than two prompts that every side timed."""
    prompts = []
    for i, x in enumerate(xs):
        own = _run_figures(x)
        others = [f for r in refs if (f := _run_figures(r[i]))]
        if own and others:
            prompts.append((own, others))
    if len(prompts) < 2:
        return None
    rng = random.Random(seed)

    def middle(runs: list[float]) -> float:
        if len(runs) == 1:
            return runs[0]
        drawn = sorted(rng.choices(runs, k=len(runs)))
        return drawn[(len(drawn) - 1) // 2]

    medians = sorted(
        statistics.median(middle(own) / max(middle(o) for o in others)
                          for own, others in rng.choices(prompts, k=len(prompts)))
        for _ in range(INTERVAL_RESAMPLES))
    tail = (1.0 - INTERVAL_LEVEL) / 2.0
    return [medians[int(tail * INTERVAL_RESAMPLES)], medians[int((1.0 - tail) * INTERVAL_RESAMPLES) - 1]]


def summarize(label: str, n_draft: int | None, is_peer: bool, xs: list[PromptRun], runs: dict[str, list[PromptRun]],
              peers: list[str], llama_cpp_modes: list[str]) -> MethodSummary:
    """A method's summary; runs holds every method's runs (aligned by prompt), "none" among them."""
    tps = [x.tokens_per_second for x in xs]
    none = runs["none"]
    tpc = draft_share = verify_share = plain_share = None
    drafted = sum(x.n_drafted or 0 for x in xs)
    acceptance = sum(x.n_accepted or 0 for x in xs) / drafted if drafted else None
    if not is_peer:
        calls = sum(x.n_target_calls or 0 for x in xs)
        tpc = sum(x.n_generated for x in xs) / calls if calls else None
        plain_share = sum(x.n_empty_drafts or 0 for x in xs) / calls if calls else None
        total = sum(x.t_total_ms or 0.0 for x in xs)
        draft_share = sum(x.t_draft_ms or 0.0 for x in xs) / total if total else None
        verify_share = sum(x.t_verify_ms or 0.0 for x in xs) / total if total else None
    decode = [x.decode_tokens_per_second for x in xs if x.decode_tokens_per_second is not None]
    plain = [x.decode_tokens_per_second for x in runs["llama.cpp"]] if "llama.cpp" in runs else []
    return MethodSummary(
        method=label, n_draft=n_draft,
        tokens_per_second=statistics.median(tps), tokens_per_second_min=min(tps), tokens_per_second_max=max(tps),
        speedup_vs_none=_median_ratio(xs, [r.tokens_per_second for r in none], _wall) or 0.0,
        speedup_vs_peers={p: _median_ratio(xs, [r.tokens_per_second for r in runs[p]], _wall) or 0.0 for p in peers},
        acceptance_rate=acceptance, tokens_per_target_call=tpc, draft_time_share=draft_share,
        verify_time_share=verify_share, plain_step_share=plain_share,
        greedy_identical=sum(x.identical_to_none is True for x in xs), n_prompts=len(xs),
        decode_tokens_per_second=statistics.median(decode) if len(decode) == len(xs) else None,
        decode_speedup_vs_none=_median_ratio(xs, [r.decode_tokens_per_second for r in none], _decode),
        decode_speedup_vs_llama_cpp=_median_ratio(xs, plain, _decode) if plain else None,
        decode_speedup_vs_best_llama_cpp=versus_best_llama_cpp(xs, runs, llama_cpp_modes),
        per_prompt=xs,
    )  # fmt: skip


# -- output --------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _ratio(x: float | None, interval: list[float] | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}x" + (f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "")


def _repack_text(repack: bool | str) -> str:
    if isinstance(repack, bool):
        return "on" if repack else "off"
    return {"all": "on", "weights": "weights only (no AMX)"}.get(repack, repack)


def _decoding_text(report: BenchReport) -> str:
    if report.temperature <= 0:
        return "greedy"
    seed = "unseeded" if report.seed is None else f"seed {report.seed}"
    return (f"sampled at temperature {report.temperature:g} (top-k, top-p, min-p off; {seed}; outputs differ between "
            "methods by design, identity with none not checked)")


def format_markdown(report: BenchReport, python_peers: tuple[str, ...] = ("peer-llama-cpp", "peer-pld")) -> str:
    peers = [r.method for r in report.results if r.method.split(":")[0] in python_peers]
    with_llama_cpp = bool(report.llama_cpp_modes)
    with_plain = "llama.cpp" in report.llama_cpp_modes
    lines = [
        f"target {report.target}, draft {report.draft or '-'}" + (f", head {report.head}" if report.head else "")
        + (f", n-gram table {report.ngram}" if report.ngram else "")
        + f", suite {report.suite} ({report.n} prompts), "
        f"{_decoding_text(report)}, chat template, {report.max_tokens} new tokens at most, {report.threads} threads, "
        f"repack {_repack_text(report.repack)}"
        + (f", llama.cpp's tools repack {'on' if report.llama_cpp_repack else 'off'}"
           if report.llama_cpp_repack is not None else "")
        + (f", huge pages {'on' if report.huge_pages else 'off'}" if report.huge_pages is not None else "")
        + (f", flash attention {'on' if report.flash_attn else 'off'} (decided by measurement), llama.cpp's "
           "tools their own default (-fa auto)" if report.llama_cpp_flash_attn == "auto"
           else ", flash attention on (every method and peer)" if report.flash_attn else "")
        + (f", {report.settle_s:g} s pause before each run" if report.settle_s else "")
        + (f", each method run {report.repeats} times per prompt (interleaved) and the run with the "
           + ("median" if report.repeats % 2 else "lower middle") + " decode tok/s kept" if report.repeats > 1 else ""),
        f"{report.timing}; {report.decode_timing}; {report.speedup}; tok/s is the median (min-max) over prompts; "
        f"{report.identity}." + (f" {BEST_MODE_NOTE}." if with_llama_cpp else ""),
        "",
        "| method | n_draft | tok/s | speedup vs none | " + "".join(f"speedup vs {p} | " for p in peers)
        + "decode tok/s | decode vs none | " + ("decode vs llama.cpp | " if with_plain else "")
        + ("decode vs best llama.cpp mode | " if with_llama_cpp else "")
        + "acceptance | tokens/target call | plain steps | draft / verify time | identical to none |",
        "|---|---|---|---|" + "---|" * len(peers) + "---|---|" + "---|" * (with_plain + with_llama_cpp)
        + "---|---|---|---|---|",
    ]
    for r in report.results:
        split = ("-" if r.draft_time_share is None
                 else f"{100 * r.draft_time_share:.0f}% / {100 * (r.verify_time_share or 0.0):.0f}%")
        lines.append(
            f"| {r.method} | {_fmt(r.n_draft, 'd')} | {r.tokens_per_second:.1f} ({r.tokens_per_second_min:.1f}-"
            f"{r.tokens_per_second_max:.1f}) | {r.speedup_vs_none:.2f}x | "
            + "".join(f"{r.speedup_vs_peers[p]:.2f}x | " for p in peers)
            + f"{_fmt(r.decode_tokens_per_second, '.1f')} | {_ratio(r.decode_speedup_vs_none)} | "
            + (f"{_ratio(r.decode_speedup_vs_llama_cpp)} | " if with_plain else "")
            + (f"{_ratio(r.decode_speedup_vs_best_llama_cpp)} | " if with_llama_cpp else "")
            + f"{_fmt(r.acceptance_rate)} | {_fmt(r.tokens_per_target_call)} | "
            f"{'-' if r.plain_step_share is None else f'{100 * r.plain_step_share:.0f}%'} | {split} | "
            + ("- |" if report.temperature > 0 else f"{r.greedy_identical}/{r.n_prompts} |")
        )
    if with_llama_cpp:
        lines += ["", *_llama_cpp_section(report)]
    if report.skipped:
        lines += ["", "Skipped:"] + [f"- {m}: {why}" for m, why in report.skipped.items()]
    divergences = [x for r in report.results for x in r.per_prompt if x.identical_to_none is False]
    if divergences:
        lines += ["", "Divergences from none (a small top-2 logit gap is a near-tie, not a verification error):"]
        lines += [f"- {x.method} {x.prompt_id}: first differs at token {x.divergence_index}, "
                  f"top-2 logit gap {_fmt(x.top2_logit_gap, '.3f')}"
                  + ("" if x.top2_logit_gap_one_token is None
                     else f" (one token at a time: {x.top2_logit_gap_one_token:.3f})") for x in divergences]
    return "\n".join(lines)


def _llama_cpp_section(report: BenchReport) -> list[str]:
    """The headline ratios and a per-prompt table of decode tok/s."""
    counts: dict[str, int] = {}
    for mode in report.best_llama_cpp_mode.values():
        counts[mode] = counts.get(mode, 0) + 1
    lines = [
        f"Against llama.cpp's own tools (decode tok/s, medians of per-prompt ratios): auto / best llama.cpp mode "
        f"{_ratio(report.auto_vs_best_llama_cpp, report.auto_vs_best_llama_cpp_interval)} "
        f"({_ratio(report.auto_vs_best_llama_cpp_within_limit)} with "
        "llama-speculative-simple's speed up to the token limit, before its last step's unbounded draft); "
        f"none / llama.cpp plain {_ratio(report.none_vs_llama_cpp, report.none_vs_llama_cpp_interval)}"
        + (f"; auto / the suite's best llama.cpp mode ({report.best_suite_llama_cpp_mode}, the highest median) "
           f"{_ratio(report.auto_vs_best_suite_llama_cpp, report.auto_vs_best_suite_llama_cpp_interval)}"
           if report.best_suite_llama_cpp_mode else "")
        + (f"; {INTERVAL_NOTE}" if report.none_vs_llama_cpp_interval or report.auto_vs_best_llama_cpp_interval
           else "")
        + ". "
        "Best mode per prompt: " + ", ".join(f"{m} {n}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        + ".",
        "",
    ]
    timed = [r for r in report.results if r.decode_tokens_per_second is not None]
    auto = report.result("auto")
    lines += [
        "| prompt | prompt tokens | " + "".join(f"{r.method} | " for r in timed) + "best llama.cpp mode | "
        + ("auto / best |" if auto else ""),
        "|---|---|" + "---|" * len(timed) + "---|" + ("---|" if auto else ""),
    ]
    for i, x in enumerate(report.results[0].per_prompt):
        mode = report.best_llama_cpp_mode.get(x.prompt_id, "-")
        best = report.result(mode)
        best_tps = best.per_prompt[i].decode_tokens_per_second if best else None
        auto_tps = auto.per_prompt[i].decode_tokens_per_second if auto else None
        ratio = auto_tps / best_tps if auto_tps is not None and best_tps else None
        lines.append(f"| {x.prompt_id} | {x.n_prompt_tokens} | "
                     + "".join(f"{_fmt(r.per_prompt[i].decode_tokens_per_second, '.1f')} | " for r in timed)
                     + f"{mode} | " + (f"{_ratio(ratio)} |" if auto else ""))
    return lines


def _known_fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The entries of d that are fields of dataclass cls: a report of a later version may carry
    more; fields an older one lacks take their defaults."""
    return {k: v for k, v in d.items() if k in cls.__dataclass_fields__}


def runs_from_report(report: dict[str, Any]) -> dict[str, list[PromptRun]]:
    """The per-prompt runs of each method (by label) of a report read back from its JSON
    (write_json), for scripts that recompute figures from saved reports."""
    return {r["method"]: [PromptRun(**_known_fields(PromptRun, x)) for x in r["per_prompt"]]
            for r in report["results"]}


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> BenchReport:
    """A report written by write_json, read back (to draw it again with `plot`, say), older and
    later versions' reports too (_known_fields)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ValueError(f"{path}: not a `pyspec bench --json` report (no list of results)")
    runs = runs_from_report(data)
    results = [MethodSummary(**{**_known_fields(MethodSummary, r), "per_prompt": runs[r["method"]]})
               for r in data["results"]]
    return BenchReport(**{**_known_fields(BenchReport, data), "results": results})


@dataclass
class PlotPanel:
    """One panel of `plot`: a bar per method, its median over the prompts and the min-max range."""

    ylabel: str
    methods: list[str]
    median: list[float]
    low: list[float]
    high: list[float]


def plot_panels(report: BenchReport) -> list[PlotPanel]:
    """What `plot` draws: wall tokens/s of every method, and beside it decode tokens/s (prompt
    processing left out, DECODE_NOTE) of the methods that have that figure. On a long prompt the
    prefill is most of the wall time, so the two panels can rank methods differently; the
    comparison with llama.cpp's tools is made on the decode figure."""
    wall = PlotPanel("tokens/s, wall (median, min-max)", [r.method for r in report.results],
                     [r.tokens_per_second for r in report.results],
                     [r.tokens_per_second_min for r in report.results],
                     [r.tokens_per_second_max for r in report.results])
    timed = [r for r in report.results if r.decode_tokens_per_second is not None]
    if not timed:
        return [wall]
    # a method has a decode median only when every prompt has a decode figure (summarize)
    per_prompt = [[x.decode_tokens_per_second for x in r.per_prompt] for r in timed]
    decode = PlotPanel("tokens/s, decode (median, min-max)", [r.method for r in timed],
                       [r.decode_tokens_per_second for r in timed], [min(xs) for xs in per_prompt],
                       [max(xs) for xs in per_prompt])
    return [wall, decode]


def plot(report: BenchReport, path: str | Path) -> None:
    """Bar charts of tokens/s per method (`plot_panels`: wall, and decode where measured) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install matplotlib "
                          "(or pip install 'pyspec-engine[bench]')") from None
    panels = plot_panels(report)
    width = max(4.0, 1.2 * len(report.results))
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.5), squeeze=False)
    try:
        for ax, panel in zip(axes[0], panels):
            err = [[m - lo for m, lo in zip(panel.median, panel.low)],
                   [hi - m for m, hi in zip(panel.median, panel.high)]]
            ax.bar(panel.methods, panel.median, yerr=err, capsize=4,
                   color=["#888" if n == "none" else "#3a7" for n in panel.methods])
            ax.set_ylabel(panel.ylabel)
            ax.tick_params(axis="x", labelrotation=20)
        fig.suptitle(f"{report.suite}, {report.n} prompts, {report.max_tokens} tokens, {report.threads} threads",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
