"""`pyspec bench` on the tiny models: report structure, greedy identity, the llama.cpp peers."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pyspec.bench import (BenchReport, decode_tokens_per_second, format_markdown, parse_methods, run_bench, suite_prompts,
                          write_json)

from test_cli import pyspec_cli

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "the cat sat on the mat, the cat sat on the",
    [{"role": "user", "content": "hello hello hello"}],
]
METHODS = "none,auto,chain:3,tree:8,beam:2x3,lookup:4,ouroboros:3,peer-llama-cpp,peer-pld:4"


@pytest.fixture(scope="module")
def report(tiny_target: str, tiny_drafts: dict[str, str]) -> BenchReport:
    return run_bench(tiny_target, tiny_drafts["perturbed"], PROMPTS, max_tokens=20, methods=METHODS, n_threads=2,
                     n_ctx=512, progress=False)


def test_decode_rate_counts_the_end_token_as_the_tools_do() -> None:
    """A run that an end token stopped after n tokens took n + 1 target steps (the first decodes
    the last prompt token): its decode rate counts n + 1 tokens, one stopped by the limit n."""
    stats = SimpleNamespace(n_generated=50, t_total_ms=1500.0, t_prefill_ms=500.0)
    assert decode_tokens_per_second(stats, "stop") == pytest.approx(51.0)
    assert decode_tokens_per_second(stats, "length") == pytest.approx(50.0)
    assert decode_tokens_per_second(SimpleNamespace(n_generated=0, t_total_ms=5.0, t_prefill_ms=5.0), "stop") == 0.0


def test_a_negative_pause_is_refused(tiny_target: str) -> None:
    with pytest.raises(ValueError, match="settle_s must be >= 0 seconds, got -1"):
        run_bench(tiny_target, None, ["hi"], max_tokens=2, methods="none", settle_s=-1.0, progress=False)


def test_parse_methods() -> None:
    specs = parse_methods("lookup:8,chain,peer-pld", n_draft=5)
    assert [(m.label, m.name, m.n_draft) for m in specs] == [
        ("none", "none", None), ("lookup:8", "lookup", 8), ("chain", "chain", 5), ("peer-pld", "peer-pld", 5)]
    with pytest.raises(ValueError, match="unknown method 'forest'.*available: auto, none, chain, tree, beam, lookup, ouroboros, redrafter, eagle, peer"):
        parse_methods("none,forest")
    specs = parse_methods("tree:24,beam:3x6,tree")
    assert [(m.label, m.name, dict(m.options)) for m in specs[1:]] == [
        ("tree:24", "tree", {"tree_nodes": 24}), ("beam:3x6", "beam", {"beams": 3, "beam_length": 6}),
        ("tree", "tree", {})]
    specs = parse_methods("auto,auto:no-head,auto:no-draft,redrafter:2x5,redrafter")
    assert [(m.label, m.name, dict(m.options)) for m in specs[1:]] == [
        ("auto", "auto", {}), ("auto:no-head", "auto", {"auto_head": False}),
        ("auto:no-draft", "auto", {"auto_draft_model": False}),
        ("redrafter:2x5", "redrafter", {"beams": 2, "beam_length": 5}), ("redrafter", "redrafter", {})]
    with pytest.raises(ValueError, match="expected auto:no-head or auto:no-draft"):
        parse_methods("auto:4")
    with pytest.raises(ValueError, match="expected redrafter:KxL"):
        parse_methods("redrafter:4")
    with pytest.raises(ValueError, match="expected beam:KxL"):
        parse_methods("beam:4")
    with pytest.raises(ValueError, match="expected tree:N"):
        parse_methods("tree:0")
    assert [(m.label, dict(m.options)) for m in parse_methods("eagle:16,eagle")[1:]] == [
        ("eagle:16", {"tree_nodes": 16}), ("eagle", {})]
    with pytest.raises(ValueError, match="expected eagle:N"):
        parse_methods("eagle:2x4")
    with pytest.raises(ValueError, match="positive integer"):
        parse_methods("lookup:x")
    with pytest.raises(ValueError, match="twice"):
        parse_methods("none,none")


def test_report_structure_and_identity(report: BenchReport) -> None:
    assert report.methods == METHODS.split(",")
    assert report.suite == "custom" and report.n == len(PROMPTS) and report.threads == 2
    assert report.huge_pages is True  # the engine's default, which llama.cpp's tools would follow
    assert report.settle_s == 0.0  # no llama.cpp tool ran: no pause between runs
    by_method = {r.method: r for r in report.results}
    none = [x.tokens for x in by_method["none"].per_prompt]
    assert all(len(t) > 0 for t in none)
    for r in report.results:
        assert r.n_prompts == len(PROMPTS) and len(r.per_prompt) == len(PROMPTS)
        assert [x.prompt_id for x in r.per_prompt] == ["custom/0", "custom/1", "custom/2"]
        assert r.tokens_per_second_min <= r.tokens_per_second <= r.tokens_per_second_max
        assert r.speedup_vs_none > 0 and set(r.speedup_vs_peers) == {"peer-llama-cpp", "peer-pld:4"}
        # The tiny f32 model has no batched-vs-single near-ties: every method, pyspec's and the
        # peers' (same prompt tokens, greedy), reproduces plain decoding exactly.
        assert [x.tokens for x in r.per_prompt] == none, r.method
        assert r.greedy_identical == len(PROMPTS)
    assert by_method["none"].speedup_vs_none == 1.0
    assert by_method["chain:3"].acceptance_rate is not None and by_method["chain:3"].n_draft == 3
    assert by_method["chain:3"].draft_time_share is not None and by_method["chain:3"].draft_time_share > 0
    assert by_method["none"].acceptance_rate is None and by_method["none"].tokens_per_target_call == 1.0
    assert by_method["none"].plain_step_share == 1.0 and by_method["chain:3"].plain_step_share == 0.0
    auto = by_method["auto"]
    assert auto.plain_step_share is not None and 0.0 <= auto.plain_step_share <= 1.0
    assert all(x.n_empty_drafts is not None for x in auto.per_prompt)
    assert by_method["peer-pld:4"].n_draft == 4
    for peer in ("peer-llama-cpp", "peer-pld:4"):
        assert by_method[peer].acceptance_rate is None and by_method[peer].tokens_per_target_call is None
        assert by_method[peer].per_prompt[0].n_target_calls is None


def test_markdown(report: BenchReport) -> None:
    table = format_markdown(report)
    assert "wall time" in table and "medians of per-prompt ratios" in table
    assert "| method | n_draft | tok/s | speedup vs none | speedup vs peer-llama-cpp | speedup vs peer-pld:4 |" in table
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert set(METHODS.split(",")) <= set(rows)
    assert rows["none"].endswith("| - | 1.00 | 100% | 0% / " + rows["none"].split("| 0% / ")[1])
    assert rows["peer-llama-cpp"].endswith("| - | - | - | - | 3/3 |")
    assert rows["chain:3"].endswith("| 3/3 |") and "| 1.00x |" in rows["none"]
    assert "Divergences" not in table


def test_json(report: BenchReport, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert {"target", "draft", "suite", "n", "max_tokens", "threads", "results"} <= set(data)
    for entry in data["results"]:
        assert {"method", "tokens_per_second", "speedup_vs_none", "acceptance_rate", "tokens_per_target_call",
                "greedy_identical", "per_prompt"} <= set(entry)
        assert {"prompt_id", "tokens", "tokens_per_second", "identical_to_none"} <= set(entry["per_prompt"][0])
    from pyspec.bench import read_json

    assert read_json(path) == report
    # an older report lacks later fields (defaults) and a newer one has fields this version drops
    del data["flash_attn"], data["results"][0]["per_prompt"][0]["repeat_n_drafted"]
    data["from_a_later_version"] = 1
    data["results"][0]["per_prompt"][0]["also_later"] = 2
    path.write_text(json.dumps(data))
    again = read_json(path)
    assert again.flash_attn is False and again.results[0].per_prompt[0].repeat_n_drafted is None
    assert again.results[0].per_prompt[0].tokens == report.results[0].per_prompt[0].tokens
    path.write_text(json.dumps({"suite": "humaneval"}))
    with pytest.raises(ValueError, match="not a `pyspec bench --json` report"):
        read_json(path)


def test_suite_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """--suite SUITE[A:B] runs the first n prompts of the slice (all of it without n), and the
    report names the slice."""
    import pyspec.data

    loaded = []

    def fake_load_suite(name: str, n: int | None = None, **_: object) -> list[str]:
        loaded.append((name, n))
        return [f"{name} {i}" for i in range(n)]

    monkeypatch.setattr(pyspec.data, "load_suite", fake_load_suite)
    assert suite_prompts("humaneval", 3) == ("humaneval", ["humaneval 0", "humaneval 1", "humaneval 2"])
    assert suite_prompts("humaneval[156:164]", 2) == ("humaneval[156:164]", ["humaneval 156", "humaneval 157"])
    assert suite_prompts("gsm8k[10:12]", 5) == ("gsm8k[10:12]", ["gsm8k 10", "gsm8k 11"])
    assert suite_prompts("mtbench[3:]", 1) == ("mtbench[3:]", ["mtbench 3"])
    # no n: a closed slice whole, a suite or an open slice its first five
    assert suite_prompts("edit[0:8]")[1] == [f"edit {i}" for i in range(8)]
    assert suite_prompts("edit")[1] == [f"edit {i}" for i in range(5)]
    assert suite_prompts("edit[2:]")[1] == [f"edit {i}" for i in range(2, 7)]
    assert loaded == [("humaneval", 3), ("humaneval", 158), ("gsm8k", 12), ("mtbench", 4), ("edit", 8), ("edit", 5),
                      ("edit", 7)]
    with pytest.raises(ValueError, match="bad prompt slice"):
        suite_prompts("humaneval[5:2]", 1)


def test_a_slice_past_the_suite_end_is_refused_and_one_running_past_it_is_cut(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """MT-Bench has 80 prompts: mtbench[81:101] is an error naming the suite's size, not an empty
    run; mtbench[75:85] runs the five there are and says so."""
    import pyspec.data
    from pyspec.data import load_prompt_slices

    def fake_load_suite(name: str, n: int | None = None, **_: object) -> list[str]:
        return [f"{name} {i}" for i in range(min(80, n if n is not None else 80))]

    monkeypatch.setattr(pyspec.data, "load_suite", fake_load_suite)
    refused = r"'mtbench\[81:101\]' selects no prompt: the suite has 80"
    with pytest.raises(ValueError, match=refused):
        suite_prompts("mtbench[81:101]")
    with pytest.raises(ValueError, match=refused):
        load_prompt_slices(["mtbench[81:101]"])
    with caplog.at_level("WARNING", logger="pyspec.data"):
        assert load_prompt_slices(["mtbench[75:85]"]) == [f"mtbench {i}" for i in range(75, 80)]
        assert suite_prompts("mtbench[78:90]")[1] == ["mtbench 78", "mtbench 79"]
    assert "the suite ends at 80, so it selects 5 prompts, not 10" in caplog.text
    assert "selects 2 prompts, not 12" in caplog.text


def test_cli_bench(tiny_target: str, tiny_drafts: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    p = pyspec_cli("bench", "--target", tiny_target, "--draft", tiny_drafts["identical"], "--prompt", PROMPTS[0],
                   "--prompt", PROMPTS[1], "--max-tokens", "8", "--methods", "chain:2,lookup,peer-llama-cpp",
                   "--threads", "2", "--json", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "| chain:2 | 2 |" in p.stdout and "| peer-llama-cpp | - |" in p.stdout
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["results"]] == ["none", "chain:2", "lookup", "peer-llama-cpp"]
    assert all(r["greedy_identical"] == 2 for r in data["results"])
    p = pyspec_cli("bench", "--target", tiny_target, "--methods", "none,forest")
    assert p.returncode == 1 and "unknown method 'forest'" in p.stderr and "Traceback" not in p.stderr


def test_plot_writes_png(report: BenchReport, tmp_path: Path) -> None:
    from pyspec.bench import plot

    path = tmp_path / "bench.png"
    plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_panels_put_decode_rates_beside_wall_rates(report: BenchReport) -> None:
    """The plot's second panel is decode tok/s of the methods that measure it (pyspec's; the
    llama-cpp-python peers have none), median and range over the prompts; without any decode
    figure there is the wall panel alone."""
    import dataclasses
    import statistics

    from pyspec.bench import plot_panels

    wall, decode = plot_panels(report)
    assert wall.methods == [r.method for r in report.results]
    assert wall.median == [r.tokens_per_second for r in report.results]
    pyspec_methods = [r.method for r in report.results if not r.method.startswith("peer-")]
    assert decode.methods == pyspec_methods and len(pyspec_methods) == 7
    for name, median, low, high in zip(decode.methods, decode.median, decode.low, decode.high):
        rates = [x.decode_tokens_per_second for x in next(r for r in report.results if r.method == name).per_prompt]
        assert (median, low, high) == (statistics.median(rates), min(rates), max(rates))
        assert low < high  # three different prompts
    untimed = dataclasses.replace(report, results=[dataclasses.replace(r, decode_tokens_per_second=None)
                                                   for r in report.results])
    assert [p.ylabel for p in plot_panels(untimed)] == [wall.ylabel]


def test_plot_without_matplotlib_says_how_to_install(report: BenchReport, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from pyspec.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot(report, tmp_path / "bench.png")


def test_ratio_interval_is_the_spread_the_runs_leave() -> None:
    """ratio_interval: runs that agree give the point itself; a steady 10% gap under small noise
    gives an interval that excludes 1; the same gap under more noise a wider one; too few prompts
    none; the same runs always the same interval (seeded)."""
    import random

    from pyspec.bench.report import PromptRun, ratio_interval

    def runs(label: str, rates: list[list[float]]) -> list[PromptRun]:
        return [PromptRun(f"s/{i}", label, 100, 50, 5.0, 10.0, "length", [],
                          decode_tokens_per_second=sorted(r)[(len(r) - 1) // 2],
                          repeat_decode_tokens_per_second=r if len(r) > 1 else None) for i, r in enumerate(rates)]

    steady = ratio_interval(runs("none", [[90.0] * 3] * 20), [runs("llama.cpp", [[100.0] * 3] * 20)])
    assert steady == pytest.approx([0.9, 0.9])
    rng = random.Random(1)

    def noisy(speed: float, spread: float) -> list[list[float]]:
        return [[speed * rng.uniform(1 - spread, 1 + spread) for _ in range(3)] for _ in range(20)]

    none_small, plain_small = runs("none", noisy(90, 0.03)), runs("llama.cpp", noisy(100, 0.03))
    small = ratio_interval(none_small, [plain_small])
    assert small is not None and small[0] <= small[1] < 1.0 and small[0] > 0.8
    point = statistics.median(x.decode_tokens_per_second / y.decode_tokens_per_second
                              for x, y in zip(none_small, plain_small))
    assert small[0] <= point <= small[1]
    large = ratio_interval(runs("none", noisy(90, 0.25)), [runs("llama.cpp", noisy(100, 0.25))])
    assert large is not None and large[1] - large[0] > 2 * (small[1] - small[0])
    assert ratio_interval(none_small, [plain_small]) == small
    assert ratio_interval(none_small[:1], [plain_small[:1]]) is None
    # the reference of a prompt is the fastest of several peers' runs
    faster = runs("llama.cpp-ngram-mod", [[120.0] * 3] * 20)
    assert ratio_interval(runs("none", [[90.0] * 3] * 20),
                          [runs("llama.cpp", [[100.0] * 3] * 20), faster]) == pytest.approx([0.75, 0.75])


def test_ratios_against_the_best_llama_cpp_mode_of_each_prompt() -> None:
    """Hand-made runs: decode tok/s per prompt, the best llama.cpp mode picked per prompt (plain
    included), medians of per-prompt ratios in the summaries, the report and the markdown."""
    from pyspec.bench.runner import _report
    from pyspec.bench.report import PromptRun

    decode = {  # method -> decode tok/s on prompts 0, 1, 2
        "none": [10.0, 10.0, 10.0], "auto": [30.0, 12.0, 20.0],
        "llama.cpp": [11.0, 12.5, 10.0], "llama.cpp-ngram-mod": [20.0, 10.0, 40.0], "llama.cpp-ngram-simple": [24.0, 8.0, 25.0],
    }
    runs = {m: [PromptRun(f"s/{i}", m, 100, 50, 5.0, 10.0, "length", [], decode_tokens_per_second=v,
                          decode_tokens_per_second_within_limit=v) for i, v in enumerate(vs)] for m, vs in decode.items()}
    for x, v in zip(runs["llama.cpp-ngram-mod"], [15.0, 10.0, 20.0]):  # its last step ran past the limit
        x.decode_tokens_per_second_within_limit = v
    specs = parse_methods(",".join(decode))
    report = _report(specs, runs, {}, target="t", draft=None, suite="s", max_tokens=50, threads=2, repack=True)
    assert report.best_llama_cpp_mode == {"s/0": "llama.cpp-ngram-simple", "s/1": "llama.cpp", "s/2": "llama.cpp-ngram-mod"}
    # auto / best: 30/24, 12/12.5, 20/40 -> median 0.96; none / plain: 10/11, 10/12.5, 10/10 -> median 10/11
    assert report.auto_vs_best_llama_cpp == pytest.approx(12 / 12.5)
    assert report.none_vs_llama_cpp == pytest.approx(10 / 11)
    # the suite's best single mode: medians plain 11, ngram-mod 20, ngram-simple 24; auto / ngram-simple
    # 30/24, 12/8, 20/25 -> median 1.25 (against each prompt's best it is 0.96)
    assert report.best_suite_llama_cpp_mode == "llama.cpp-ngram-simple"
    assert report.auto_vs_best_suite_llama_cpp == pytest.approx(1.25)
    # within the limit the best modes are ngram-simple (24), plain (12.5), ngram-simple (25): 1.25, 0.96, 0.8
    assert report.auto_vs_best_llama_cpp_within_limit == pytest.approx(12 / 12.5)
    runs["auto"][1].decode_tokens_per_second_within_limit = 14.0
    assert _report(specs, runs, {}, target="t", draft=None, suite="s", max_tokens=50, threads=2,
                   repack=True).auto_vs_best_llama_cpp_within_limit == pytest.approx(14 / 12.5)
    auto = report.result("auto")
    assert auto is not None and auto.decode_tokens_per_second == 20.0
    assert auto.decode_speedup_vs_none == pytest.approx(2.0) and auto.decode_speedup_vs_llama_cpp == pytest.approx(2.0)
    table = format_markdown(report)
    assert "(0.96x with llama-speculative-simple's speed up to the token limit" in table
    # 95% bootstrap intervals: with three prompts of one run each, the lowest and the highest
    # per-prompt ratio (the median of a resample is one of them in over a quarter of the draws)
    assert report.none_vs_llama_cpp_interval == pytest.approx([0.8, 1.0])
    assert report.auto_vs_best_llama_cpp_interval == pytest.approx([0.5, 1.25])
    assert report.auto_vs_best_suite_llama_cpp_interval == pytest.approx([0.8, 1.5])
    assert ("none / llama.cpp plain 0.91x [0.80-1.00]; auto / the suite's best llama.cpp mode "
            "(llama.cpp-ngram-simple, the highest median) 1.25x [0.80-1.50]; in brackets after a ratio: its 95% "
            "bootstrap interval") in table
    assert "auto / best llama.cpp mode 0.96x [0.50-1.25] (0.96x with" in table
    assert "| s/0 | 100 | 10.0 | 30.0 | 11.0 | 20.0 | 24.0 | llama.cpp-ngram-simple | 1.25x |" in table
    assert "| decode tok/s | decode vs none | decode vs llama.cpp | decode vs best llama.cpp mode |" in table
    # the repacking settings of both sides are stated (on AMX CPUs they can differ, pyspec.bench.llamacpp)
    assert "repack on" in table.splitlines()[0] and "llama.cpp's tools" not in table.splitlines()[0]
    weights = _report(specs, runs, {}, target="t", draft=None, suite="s", max_tokens=50, threads=2,
                      repack="weights", llama_cpp_repack=False)
    assert format_markdown(weights).splitlines()[0].endswith(
        "repack weights only (no AMX), llama.cpp's tools repack off")
    pages = _report(specs, runs, {}, target="t", draft=None, suite="s", max_tokens=50, threads=2,
                    repack="weights", llama_cpp_repack=True, huge_pages=False)
    assert format_markdown(pages).splitlines()[0].endswith("llama.cpp's tools repack on, huge pages off")


def test_divergence_off_a_near_tie_is_measured_again_one_token_at_a_time(
        tiny_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A divergence whose batched top-2 gap is not a near-tie gets the gap of plain decoding's
    numerics too (the context one token at a time); below NEAR_TIE only the batched gap is taken."""
    import numpy as np

    from pyspec import Engine
    from pyspec.bench import runner as bench
    from pyspec.bench.report import PromptRun

    with Engine(tiny_target, n_ctx=256, n_threads=2, prefix_cache=False) as engine:
        prompt = engine.tokenize("the cat sat on the mat")
        plain = engine.generate(prompt, max_tokens=8, method="none", return_logits=True)
        ref = PromptRun("p", "none", len(prompt), 8, 1.0, 8.0, "length", list(plain.tokens))
        index = 5
        # plain decoding's own row that chose ref.tokens[index] (prompt in one batch, then one token at a time)
        top = np.sort(plain.logits[index])[-2:]
        plain_gap = float(top[1] - top[0])

        def diverging() -> PromptRun:
            tokens = list(ref.tokens)
            tokens[index] = (tokens[index] + 1) % engine.n_vocab
            return PromptRun("p", "auto", len(prompt), 8, 1.0, 8.0, "length", tokens)

        monkeypatch.setattr(bench, "NEAR_TIE", float("inf"))  # every gap a near-tie: nothing more measured
        run = diverging()
        bench._mark_divergence(engine, run, ref, prompt, {})
        assert run.divergence_index == index and run.top2_logit_gap is not None
        assert run.top2_logit_gap_one_token is None

        # No gap is a near-tie: measured one token at a time, by an engine with a batch of 1,
        # once per prompt and divergence however many methods leave none there.
        import pyspec.engine

        batches = []

        class Recording(pyspec.engine.Engine):
            def __init__(self, *args, **kwargs):
                batches.append(kwargs.get("n_batch"))
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(pyspec.engine, "Engine", Recording)
        monkeypatch.setattr(bench, "NEAR_TIE", 0.0)
        gaps: dict = {}
        run, other = diverging(), diverging()
        bench._mark_divergence(engine, run, ref, prompt, gaps)
        bench._mark_divergence(engine, other, ref, prompt, gaps)
        assert batches == [1]
        assert run.top2_logit_gap_one_token is not None
        assert (other.top2_logit_gap, other.top2_logit_gap_one_token) == (run.top2_logit_gap,
                                                                          run.top2_logit_gap_one_token)
        # f32 weights: both evaluations and plain decoding's row agree closely
        assert run.top2_logit_gap_one_token == pytest.approx(plain_gap, abs=1e-3)
        assert run.top2_logit_gap == pytest.approx(plain_gap, abs=1e-3)

    report = bench._report(parse_methods("auto"), {"none": [ref], "auto": [run]}, {}, target="t", draft=None,
                           suite="s", max_tokens=8, threads=2, repack=False)
    assert (f"- auto p: first differs at token {index}, top-2 logit gap {run.top2_logit_gap:.3f} "
            f"(one token at a time: {run.top2_logit_gap_one_token:.3f})") in format_markdown(report)


def test_a_text_divergence_at_a_longer_token_is_placed_where_the_tool_left() -> None:
    """none wrote `)` then ` +`, the tool `))` then ` +`: the first differing byte lies in none's
    ` +`, but the tool left at the `)` (a near-tie with `))`), and the gap is measured there. A
    tool that wrote another token where none wrote ` +` is placed at ` +`."""
    import numpy as np

    from pyspec.bench import runner as bench
    from pyspec.bench.report import PromptRun

    vocab = [b"x", b")", b" +", b"))", b" 1", b"-"]
    prompt, none = [0], [0, 1, 2, 4]  # "x) + 1" after the prompt

    class Engine:  # what _mark_text_divergence reads of an engine: pieces and next-token logits
        evaluations = 0

        def detokenize_bytes(self, tokens, special=False):
            return b"".join(vocab[t] for t in tokens)

        def evaluate(self, tokens):
            Engine.evaluations += 1
            i = len(tokens) - len(prompt)  # the row predicts none's token i
            row = np.full(len(vocab), -10.0, dtype=np.float32)
            row[none[i]] = 5.0
            row[3 if i == 1 else 5] = 4.9 if i == 1 else 4.8  # '))' 0.1 behind ')', elsewhere '-' 0.2
            return row[None, :]

    def run(text: str) -> PromptRun:
        return PromptRun("p", "tool", 1, 4, 1.0, 4.0, "stop", [], text=text)

    ref = PromptRun("p", "none", 1, 4, 1.0, 4.0, "stop", none)
    longer = run("x)) + 1")
    bench._mark_text_divergence(Engine(), longer, ref, prompt, False, {})
    assert longer.divergence_index == 1 and longer.top2_logit_gap == pytest.approx(0.1, abs=1e-5)
    assert Engine.evaluations == 1  # the runner-up's evaluation also gives the gap there
    other = run("x)- 1")
    bench._mark_text_divergence(Engine(), other, ref, prompt, False, {})
    assert other.divergence_index == 2 and other.top2_logit_gap == pytest.approx(0.2, abs=1e-5)
    assert Engine.evaluations == 3


def test_repeats_keep_the_median_run_and_start_each_from_the_pool_before_the_prompt(
        tiny_target: str, tiny_drafts: dict[str, str], monkeypatch) -> None:
    """With repeats, every run of a pool-keeping method on a prompt starts from the pool the method
    had before that prompt (never from its own earlier answer to it), and the kept run's pool goes on."""
    import hashlib

    from pyspec.engine import Engine

    pools: list[str] = []  # what each run of a pyspec method started from: "empty" or the file's hash
    load, clear = Engine.load_pool, Engine.clear_pool

    def recording_load(self, path, *a, **k):
        pools.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        return load(self, path, *a, **k)

    def recording_clear(self, *a, **k):
        pools.append("empty")
        return clear(self, *a, **k)

    monkeypatch.setattr(Engine, "load_pool", recording_load)
    monkeypatch.setattr(Engine, "clear_pool", recording_clear)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        run_bench(tiny_target, None, ["hi"], max_tokens=2, methods="none", repeats=0, progress=False)
    prompts = PROMPTS[:2]
    report = run_bench(tiny_target, tiny_drafts["perturbed"], prompts, max_tokens=16, methods="none,ouroboros:3",
                       n_threads=2, n_ctx=512, progress=False, repeats=3)
    assert report.repeats == 3 and "each method run 3 times per prompt" in format_markdown(report)
    # none and ouroboros each: the warm-up, then 3 runs per prompt.
    assert len(pools) == 2 * (1 + 3 * len(prompts))
    first, second = pools[2:8], pools[8:14]
    assert first == ["empty"] * 6  # prompt 0: every repeat of both methods from an empty pool
    # prompt 1: each method's 3 repeats from one pool, ouroboros's holding prompt 0's phrases
    assert "empty" not in second and sorted(Counter(second).values()) in ([3, 3], [6]), second
    none = {x.prompt_id: x.tokens for x in report.result("none").per_prompt}
    for r in report.results:
        for x in r.per_prompt:
            rates = x.repeat_decode_tokens_per_second
            assert rates is not None and len(rates) == 3
            assert x.decode_tokens_per_second == sorted(rates)[1]  # the median run is the one kept
            kept = rates.index(x.decode_tokens_per_second)  # and its step counts beside every run's
            for field in ("n_target_calls", "n_drafted", "n_accepted"):
                counts = getattr(x, "repeat_" + field)
                assert len(counts) == 3 and all(isinstance(c, int) for c in counts), (field, counts)
                assert counts[kept] == getattr(x, field)
            assert x.tokens == none[x.prompt_id]


def test_repeats_start_from_what_auto_had_learnt_before_the_prompt(tiny_target: str, monkeypatch) -> None:
    """With repeats, every repeat on a prompt starts from auto's statistics and cost corrections
    as they were before the prompt (seen through the steps the cost model has observed when a
    repeat's first run begins); what the prompt taught goes on to the next prompt."""
    from pyspec.engine import Engine

    starts: list[tuple[str, int]] = []  # (method, steps the cost model had seen) per generation
    generate = Engine.generate

    def recording_generate(self, prompt, *a, **k):
        starts.append((k.get("method"), self._core.learnt().n_observed_steps))
        return generate(self, prompt, *a, **k)

    monkeypatch.setattr(Engine, "generate", recording_generate)
    prompts = PROMPTS[:2]
    report = run_bench(tiny_target, None, prompts, max_tokens=16, methods="none,auto", n_threads=2, n_ctx=512,
                       progress=False, repeats=3)
    assert report.repeats == 3
    runs = starts[2:]  # after the warm-up of both methods
    assert len(runs) == 2 * 3 * len(prompts)
    per_prompt = [runs[:6], runs[6:]]
    for p in per_prompt:
        repeat_firsts = [p[2 * r][1] for r in range(3)]  # each repeat's first run
        assert len(set(repeat_firsts)) == 1, p
        assert p[1][1] > p[0][1]  # within a repeat the second run sees the first one's steps
    assert per_prompt[1][0][1] > per_prompt[0][0][1]  # prompt 0's steps go on to prompt 1


def test_sampled_bench_reaches_every_method_with_its_seed(tiny_target: str) -> None:
    """run_bench(temperature=...): every method and peer samples (its outputs leave the greedy
    ones) from the seed (the same seed gives the same outputs, another seed others); identity with
    none is not checked (None, "-" in the table, no divergences listed). auto and lookup verify
    one-hot proposals with one draw per token, so for a seed they sample none's very tokens."""
    def go(seed: int, temperature: float = 1.0) -> BenchReport:
        return run_bench(tiny_target, None, PROMPTS[:2], max_tokens=12, methods="none,auto,lookup:4,peer-llama-cpp",
                         n_threads=2, n_ctx=512, progress=False, temperature=temperature, seed=seed)

    def tokens(report: BenchReport) -> dict[str, list[list[int]]]:
        return {r.method: [x.tokens for x in r.per_prompt] for r in report.results}

    first, again, other, greedy = go(1), go(1), go(2), go(1, temperature=0.0)
    assert tokens(first) == tokens(again)
    for method, outputs in tokens(first).items():
        assert outputs != tokens(other)[method] and outputs != tokens(greedy)[method], method
    assert tokens(first)["auto"] == tokens(first)["none"] == tokens(first)["lookup:4"]
    assert (first.temperature, first.seed, greedy.temperature, greedy.seed) == (1.0, 1, 0.0, None)
    assert all(x.identical_to_none is None for r in first.results for x in r.per_prompt)
    assert all(x.identical_to_none is True for x in greedy.result("lookup:4").per_prompt)
    text = format_markdown(first)
    assert "sampled at temperature 1 (top-k, top-p, min-p off; seed 1;" in text.splitlines()[0]
    rows = [line for line in text.splitlines() if line.startswith("| none |") or line.startswith("| auto |")]
    assert len(rows) == 2 and all(row.endswith("| - |") for row in rows) and "Divergences" not in text
    assert "greedy, chat template" in format_markdown(greedy).splitlines()[0]
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got -0.5"):
        run_bench(tiny_target, None, ["hi"], max_tokens=2, methods="none", temperature=-0.5, progress=False)


def _benchmark_script(name: str) -> Any:
    """benchmarks/NAME.py loaded as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_repeats_script_compares_the_median_runs_with_each_repeat_alone() -> None:
    """benchmarks/bench_repeats.py: one noisy fast run of a llama.cpp mode sets 'the best mode' of
    a single repeat, not of the median runs."""
    module = _benchmark_script("bench_repeats")

    def method(name: str, rates: list[float]) -> dict:
        run = {"prompt_id": "s/0", "method": name, "n_prompt_tokens": 5, "n_generated": 8, "wall_s": 1.0,
               "tokens_per_second": 8.0, "finish_reason": "length", "tokens": []}
        return {"method": name, "per_prompt": [{**run, "decode_tokens_per_second": sorted(rates)[1],
                                                "repeat_decode_tokens_per_second": rates}]}
    report = {"suite": "s", "n": 1, "repeats": 3, "llama_cpp_modes": ["llama.cpp", "llama.cpp-ngram-mod"],
              "results": [method("none", [10, 10, 10]), method("auto", [12, 12, 12]),
                          method("llama.cpp", [10, 14, 10]), method("llama.cpp-ngram-mod", [11, 11, 11])]}
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4] for line in module.summarize(report) if line.startswith("| ")}
    assert rows["kept runs"] == ["1.09x", "1.00x", "1.20x"]  # 12 / 11, 10 / 10, 12 / 10
    assert rows["repeat 2 alone"] == ["0.86x", "0.71x", "1.20x"]  # 12 / 14, 10 / 14
    assert rows["repeat 1 alone"] == ["1.09x", "1.00x", "1.20x"]
    assert not any("target calls" in line for line in module.summarize(report))  # no step counts kept
    # With each run's step counts: a method whose steps differ between runs (auto: in its drafted
    # tokens, with the same target calls) is told apart from one whose steps do not.
    for r, calls, drafted in zip(report["results"][:2], ([20, 20, 20], [9, 9, 9]), ([0, 0, 0], [30, 30, 41])):
        r["per_prompt"][0].update(repeat_n_target_calls=calls, repeat_n_drafted=drafted)
    rows = [line for line in module.summarize(report) if line.startswith(("| none |", "| auto |"))]
    assert rows == ["| none | 0 of 1 | s/0: 20 / 0 (10.0), 20 / 0 (10.0), 20 / 0 (10.0) |",
                    "| auto | 1 of 1 | s/0: 9 / 30 (12.0), 9 / 30 (12.0), 9 / 41 (12.0) |"], rows
    with pytest.raises(SystemExit, match="no repeats"):
        module.summarize({**report, "repeats": 1})
    # none and llama.cpp plain only (a run for `none`'s goal): the auto columns read "-"
    plain_only = {**report, "llama_cpp_modes": ["llama.cpp"],
                  "results": [method("none", [10, 10, 10]), method("llama.cpp", [10, 14, 10])]}
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4] for line in module.summarize(plain_only)
            if line.startswith("| ")}
    assert rows["kept runs"] == ["-", "1.00x", "-"] and rows["repeat 2 alone"] == ["-", "0.71x", "-"]


def test_vs_llama_cpp_summary_noise_floor() -> None:
    """vs_llama_cpp_summary.py --noise-floor: the run-to-run spread of the plain-speed methods (the
    others left out), and what "auto / best mode of each prompt" reads when every method has one
    true speed: 1 without noise or against one mode, below 1 against the fastest of several,
    the more so the more modes and the wider the spread."""
    module = _benchmark_script("vs_llama_cpp_summary")

    def result(name: str, runs: list[list[float]]) -> dict:
        return {"method": name, "per_prompt": [{"prompt_id": f"s/{i}", "repeat_decode_tokens_per_second": r}
                                               for i, r in enumerate(runs)]}
    report = {"suite": "s", "n": 2, "llama_cpp_modes": ["llama.cpp", "llama.cpp-ngram-mod"],
              "results": [result("none", [[10.0, 10.0 * math.exp(0.1)], [20.0, 20.0]]),
                          result("llama.cpp", [[5.0, 5.0 * math.exp(-0.1)], [7.0, 7.0]]),
                          result("auto", [[10.0, 30.0], [1.0, 9.0]])]}  # not a plain-speed method
    sd, n_runs = module.run_spread(report)
    # the two spread pairs have sample variance 0.1^2 / 2 each, the two steady ones 0: pooled 0.05^2
    assert n_runs == 2 and sd == pytest.approx(0.05)
    assert module.run_spread({"results": [result("none", [[10.0], [11.0]])]}) is None
    assert module.noise_floor(0.0, 3, 4, 20, rounds=50) == (1.0, 1.0, 1.0)
    one, _, _ = module.noise_floor(0.1, 3, 1, 20, rounds=400)
    four, lo, hi = module.noise_floor(0.1, 3, 4, 20, rounds=400)
    wide, _, _ = module.noise_floor(0.2, 3, 4, 20, rounds=400)
    assert one == pytest.approx(1.0, abs=0.01) and lo < four < hi < 0.99 and 0.9 < four and wide < four
    assert module.noise_floor(0.1, 3, 4, 20, rounds=400) == (four, lo, hi)  # seeded
    row = module.noise_floor_row(report, "r").split(" | ")
    assert row[1:4] == ["s", "2", "0.050"]
    # runs: the floor for that many runs per prompt at the report's spread (fewer runs: lower)
    one = module.noise_floor_row(report, "r", runs=1).split(" | ")
    assert one[1:4] == ["s", "1", "0.050"] and float(one[4][:4]) < float(row[4][:4])


def test_vs_llama_cpp_summary_script_picks_one_mode_for_the_suite() -> None:
    """benchmarks/vs_llama_cpp_summary.py: the suite's best mode is the one with the highest median
    over the prompts, not the fastest run of each prompt."""
    module = _benchmark_script("vs_llama_cpp_summary")

    def method(name: str, rates: list[float]) -> dict:
        return {"method": name, "per_prompt": [
            {"prompt_id": f"s/{i}", "method": name, "n_prompt_tokens": 5, "n_generated": 8, "wall_s": 1.0,
             "tokens_per_second": 8.0, "finish_reason": "length", "tokens": [], "decode_tokens_per_second": r}
            for i, r in enumerate(rates)]}
    # each prompt's best: 14, 13, 12 (a lucky run of another mode each time); the suite's best mode
    # is plain (median 11 against ngram-mod 10 and ngram-simple 10)
    report = {"suite": "s", "n": 3, "llama_cpp_modes": ["llama.cpp", "llama.cpp-ngram-mod", "llama.cpp-ngram-simple"],
              "results": [method("none", [11, 11, 11]), method("auto", [12, 12, 12]),
                          method("llama.cpp", [14, 11, 11]), method("llama.cpp-ngram-mod", [10, 13, 10]),
                          method("llama.cpp-ngram-simple", [10, 10, 12])]}
    row = module.summary_row(report, "r").split(" | ")
    assert row[4:8] == ["0.92x", "1.09x (llama.cpp)", "1.00x", "1.09x |"]  # 12/13; 12/11; 11/11; 12/11
    # another label in auto's place (--method): the same figures for it, "-" where a report lacks it
    relabelled = {**report, "results": [{**r, "method": "auto:no-corpus"} if r["method"] == "auto" else r
                                        for r in report["results"]]}
    assert module.summary_row(relabelled, "r", "auto:no-corpus").split(" | ")[4:8] == row[4:8]
    assert module.summary_row(relabelled, "r").split(" | ")[4:8] == ["-", "-", "1.00x", "- |"]
    # without auto: its columns read "-"
    no_auto = {**report, "results": [r for r in report["results"] if r["method"] != "auto"]}
    assert module.summary_row(no_auto, "r").split(" | ")[4:8] == ["-", "-", "1.00x", "- |"]

    # --merge: the same suite run in two parts on disjoint prompts reads as the whole run; parts
    # that overlap, or differ in their methods or suite, are refused
    def part(suite: str, first: int, last: int) -> dict:
        return {**report, "suite": suite, "n": last - first, "methods": [r["method"] for r in report["results"]],
                "results": [{**r, "per_prompt": r["per_prompt"][first:last]} for r in report["results"]]}
    whole = module.merged([part("s", 0, 2), part("s[2:3]", 2, 3)])
    assert (whole["suite"], whole["n"]) == ("s", 3)
    assert module.summary_row(whole, "r").split(" | ")[1:8] == ["s", "3", "1"] + row[4:8]
    with pytest.raises(ValueError, match="more than one report: s/1"):
        module.merged([part("s", 0, 2), part("s[1:3]", 1, 3)])
    with pytest.raises(ValueError, match="differ in methods"):
        module.merged([part("s", 0, 2), {**part("s[2:3]", 2, 3), "methods": ["none"]}])
    with pytest.raises(ValueError, match="cannot merge suite 't'"):
        module.merged([part("s", 0, 2), part("t", 2, 3)])
    # common: a part that also ran plain merges on the methods both ran; each prompt's best mode is
    # then the best of the two n-gram modes (10, 13, 12 -> 12/10, 12/13, 12/12)
    no_plain = part("s", 0, 2)
    no_plain = {**no_plain, "methods": [x for x in no_plain["methods"] if x != "llama.cpp"],
                "llama_cpp_modes": no_plain["llama_cpp_modes"][1:],
                "results": [r for r in no_plain["results"] if r["method"] != "llama.cpp"]}
    with pytest.raises(ValueError, match="differ in methods"):
        module.merged([no_plain, part("s[2:3]", 2, 3)])
    assert module.common_methods([no_plain, part("s[2:3]", 2, 3)])[1] == ["llama.cpp"]
    whole = module.merged([no_plain, part("s[2:3]", 2, 3)], common=True)
    assert whole["llama_cpp_modes"] == ["llama.cpp-ngram-mod", "llama.cpp-ngram-simple"]
    # (both modes' medians are 10: the first in the report's order is the suite's best)
    assert module.summary_row(whole, "r").split(" | ")[4:8] == ["1.00x", "1.20x (llama.cpp-ngram-mod)", "-", "1.09x |"]


def test_vs_llama_cpp_summary_pools_runs_made_apart() -> None:
    """vs_llama_cpp_summary.py --pool: runs of the same prompts made apart (parts, a whole run, a
    --repeats run) become one report in which each prompt keeps the run with the median decode
    tok/s of all its runs, the others listed; unequal runs and other settings are refused."""
    module = _benchmark_script("vs_llama_cpp_summary")
    modes = ["llama.cpp", "llama.cpp-ngram-mod"]

    def report(suite: str, rates: dict[str, list[float | list[float]]], first: int = 0, **settings: Any) -> dict:
        def record(name: str, i: int, r: float | list[float]) -> dict:
            rec = {"prompt_id": f"s/{first + i}", "method": name, "n_prompt_tokens": 5, "n_generated": 8,
                   "wall_s": 1.0, "tokens_per_second": 8.0, "finish_reason": "length", "tokens": [],
                   "n_target_calls": 8}
            if isinstance(r, list):  # a --repeats run: kept the median, every run listed
                return {**rec, "decode_tokens_per_second": sorted(r)[(len(r) - 1) // 2],
                        "repeat_decode_tokens_per_second": r, "repeat_n_target_calls": [8, 7, 9]}
            return {**rec, "decode_tokens_per_second": r}
        return {"suite": suite, "n": len(next(iter(rates.values()))), "methods": list(rates), "llama_cpp_modes": modes,
                "threads": 2, "settle_s": 3.0, "repeats": 1, **settings,
                "results": [{"method": m, "per_prompt": [record(m, i, r) for i, r in enumerate(v)]}
                            for m, v in rates.items()]}
    # prompt s/0: auto runs 12, 9, 11, 10, 14 (kept 11); plain 10, 10, 13, 9, 10 (kept 10); mod 9, 9, 9, 15, 9
    part1 = report("s[0:1]", {"auto": [12], "llama.cpp": [10], "llama.cpp-ngram-mod": [9]})
    part2 = report("s[1:2]", {"auto": [20], "llama.cpp": [20], "llama.cpp-ngram-mod": [25]}, first=1)
    whole = report("s", {"auto": [9, 18], "llama.cpp": [10, 21], "llama.cpp-ngram-mod": [9, 24]})
    repeats = report("s", {"auto": [[11, 10, 14], [19, 17, 23]], "llama.cpp": [[13, 9, 10], [22, 20, 19]],
                           "llama.cpp-ngram-mod": [[9, 15, 9], [26, 22, 23]]}, repeats=3, settle_s=2.0)
    pool = module.pooled([part1, part2, whole, repeats])
    assert (pool["suite"], pool["n"], pool["repeats"]) == ("s", 2, 5)
    auto = pool["results"][0]["per_prompt"]
    assert [x["prompt_id"] for x in auto] == ["s/0", "s/1"]
    assert [x["decode_tokens_per_second"] for x in auto] == [11, 19]
    assert sorted(auto[0]["repeat_decode_tokens_per_second"]) == [9, 10, 11, 12, 14]
    # s/1's kept auto run is the repeats run's first, its record's own kept run; s/0's kept 11 is
    # likewise its kept run; a kept run that is not its record's kept one takes its own counts
    best = {m["method"]: [x["decode_tokens_per_second"] for x in m["per_prompt"]] for m in pool["results"]}
    assert best == {"auto": [11, 19], "llama.cpp": [10, 20], "llama.cpp-ngram-mod": [9, 24]}
    assert [x["n_target_calls"] for x in module._runs_of(repeats["results"][0]["per_prompt"][0])] == [8, 7, 9]
    assert sorted(auto[0]["repeat_n_target_calls"]) == [7, 8, 8, 8, 9]
    # a peer without decode timings (llama-cpp-python): its repeats are wall tok/s, and stay so
    peer = {"prompt_id": "s/0", "tokens_per_second": 6.0, "decode_tokens_per_second": None,
            "repeat_decode_tokens_per_second": [6.0, 5.0, 7.0]}
    assert [(x["tokens_per_second"], x["decode_tokens_per_second"]) for x in module._runs_of(peer)] == \
        [(6.0, None), (5.0, None), (7.0, None)]
    # auto / best mode of each prompt: 11/10, 19/24 -> median 0.946; the suite's best mode is
    # ngram-mod (median 16.5 against plain's 15): 11/9, 19/24 -> median 1.007
    assert module.summary_row(pool, "r").split(" | ")[1:6] == ["s", "2", "5", "0.95x", "1.01x (llama.cpp-ngram-mod)"]
    # --interval: each ratio with its bootstrap interval over the prompts and their pooled runs
    cells = module.summary_row(pool, "r", interval=True).split(" | ")
    low, high = (float(v) for v in cells[4].split("[")[1].rstrip("]").split("-"))
    assert cells[4].startswith("0.95x [") and low < 0.946 < high
    assert cells[5].startswith("1.01x [") and cells[5].endswith("(llama.cpp-ngram-mod)")
    with pytest.raises(ValueError, match="unequal runs: 1 of auto on s/1, 2 elsewhere"):
        module.pooled([part1, part2, part1])
    with pytest.raises(ValueError, match="differ in threads"):
        module.pooled([whole, {**whole, "threads": 4}])
    with pytest.raises(ValueError, match="cannot pool suite 't'"):
        module.pooled([whole, {**whole, "suite": "t"}])


def test_auto_replay_reads_the_prompts_of_a_sliced_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/auto_replay.py --bench: a report of `--suite 'longedit[10:20]'` records that name;
    the replay takes the slice's prompts (by the ids the report's runs carry), not the suite's first."""
    module = _benchmark_script("auto_replay")

    suite = [SimpleNamespace(id=f"s/{i}", messages=[{"role": "user", "content": f"prompt {i}"}]) for i in range(30)]
    asked = []

    def fake_load_suite(name: str, n: int | None = None) -> list:
        asked.append((name, n))
        return suite[:n]

    monkeypatch.setattr("pyspec.data.load_suite", fake_load_suite)  # what pyspec.bench.suite_prompts reads
    engine = SimpleNamespace(prompt_tokens=lambda messages: [len(messages[0]["content"]), int(messages[0]["content"][7:])])
    got = module.prompt_tokens(engine, "s[10:20]", 10)
    assert asked == [("s", 20)]
    assert list(got) == [f"s/{i}" for i in range(10, 20)] and got["s/12"] == [9, 12]
    assert list(module.prompt_tokens(engine, "s", 3)) == ["s/0", "s/1", "s/2"] and asked[-1] == ("s", 3)
    with pytest.raises(ValueError, match="bad prompt slice"):
        module.prompt_tokens(engine, "s[5:2]", 3)


def test_auto_replay_replays_with_the_reports_target(tmp_path: Path) -> None:
    """benchmarks/auto_replay.py: a report's outputs are its target's tokens, so the replay
    tokenizes and charges with that target unless --target names one."""
    module = _benchmark_script("auto_replay")
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"target": "smollm2-135m-instruct", "results": []}), encoding="utf-8")
    assert module.replay_target(None, [report]) == "smollm2-135m-instruct"
    assert module.replay_target("m.gguf", [report]) == "m.gguf"
    assert module.replay_target(None, []) == module.TARGET
    report.write_text(json.dumps({"results": []}), encoding="utf-8")  # a report without the field
    assert module.replay_target(None, [report]) == module.TARGET


class _Curve:
    """A cost curve as auto_replay's models read it: at(k), the time of a step of k tokens."""

    def __init__(self, fn: Any) -> None:
        self.at = fn


def test_copy_optimum_is_the_cheapest_split_of_the_copyable_stretches() -> None:
    """benchmarks/auto_replay.py --copy-optimum: with free batches the optimum is the fewest steps
    a drafter of copies could take (a step drafts any stretch of the output found in the text known
    before it, and commits it and the target's own next token); with steps that cost their tokens
    nothing can gain, and a cheaper larger step is taken by padding."""
    module = _benchmark_script("auto_replay")
    prompt = list(range(100, 120))
    copied = list(range(100, 110))  # ten tokens of the prompt
    fresh = [7, 8, 9]  # found nowhere before
    output = fresh + copied + fresh
    assert module.copyable_lengths(prompt, output, 64)[:4] == [0, 0, 0, 10]  # output[3:13] is the prompt's
    # the second `fresh` is found in the output: after 13 tokens, output[13:16] occurred at 0
    assert module.copyable_lengths(prompt, output, 64)[13] == 3
    free = _Curve(lambda k: 1.0)
    # 7 | 8 | 9 | the copy drafted, the step committing it and the target's 7 | 8 drafted (found
    # after the output's first 7), the step committing it and 9: five steps, none fewer
    assert module.copy_optimum_steps(prompt, output, free)[0] == 5.0
    linear = _Curve(lambda k: 2.0 * k)
    assert module.copy_optimum_steps(prompt, output, linear)[0] == 2.0 * len(output)
    # a step of 4 tokens costs less than one of 2 or 3: a 1-token copy is padded to it
    stepped = _Curve(lambda k: {1: 1.0, 2: 3.0, 3: 3.0, 4: 1.5}.get(k, 100.0))
    assert module.copy_optimum_steps([5], [1, 5, 2], stepped)[0] == 1.0 + 1.5
    # its steps: (committed before, drafted, size paid), covering the output once each, each
    # drafting a copyable stretch, paid what the time says
    lengths = module.copyable_lengths(prompt, output, module.OPTIMUM_MAX_DEPTH)
    time, steps = module.copy_optimum_steps(prompt, output, free)
    assert module.copy_optimum_steps(prompt, output, free, lengths=lengths) == (time, steps)  # given, not searched again
    assert time == 5.0 and len(steps) == 5 and steps[0][0] == 0
    for (c, d, k), following in zip(steps, [s[0] for s in steps[1:]] + [len(output)]):
        assert c + 1 + d == following and d <= lengths[c] and k == 1 + d
    assert module.copy_optimum_steps([5], [1, 5, 2], stepped) == (2.5, [(0, 0, 1), (1, 1, 4)])  # 5 padded to 4


def test_regret_by_start_splits_autos_time_beyond_the_optimum() -> None:
    """auto_replay.py --regret: each of auto's steps loses its time plus the optimum's time from
    where it ends minus the optimum's from where it starts; per span of where steps start, summing
    to auto's time minus the optimum's."""
    module = _benchmark_script("auto_replay")
    prompt = list(range(100, 120))
    output = [7, 8, 9, *range(100, 110), 7, 8, 9]  # as in the optimum's test above
    lengths = module.copyable_lengths(prompt, output, module.OPTIMUM_MAX_DEPTH)
    plain = [1] * len(output), [0] * len(output)
    # Free steps: plain decoding takes 16 where the optimum takes 5. The first three lose nothing
    # (the optimum decodes those tokens plainly too), the others one each but two: the one that
    # commits the copy's last token (the optimum's steps end there too) and the last.
    free = _Curve(lambda k: 1.0)
    assert module.regret_by_start(lengths, *plain, free) == [0.0, 0.0, 6.0, 5.0, 0.0]  # 16 - 5
    # Steps that cost their tokens: plain decoding is optimal; a first step of 3 tokens that
    # commits one loses the two it paid for.
    linear = _Curve(lambda k: 2.0 * k)
    assert module.regret_by_start(lengths, *plain, linear) == [0.0] * 5
    assert module.regret_by_start(lengths, [3] + [1] * 15, [0] * 16, linear) == [4.0, 0.0, 0.0, 0.0, 0.0]


def test_shuffled_totals_replay_the_requests_in_seeded_orders() -> None:
    """auto_replay.py --shuffles N: each order's total modelled speedup over plain decoding (all
    the requests' tokens at the one-token cost over the replayed steps' cost); the orders are the
    same on every run, and a replay whose steps depend on what came before gives each its own."""
    module = _benchmark_script("auto_replay")
    curve = _Curve(lambda k: 10.0 + 2.0 * (k - 1))
    requests = [([1], [0] * 4), ([2], [0] * 6), ([3], [0] * 2)]  # 12 output tokens: plain 120 ms
    seen_orders = []

    def independent(reqs: list) -> list:  # one step of all tokens per request, whatever came before
        seen_orders.append([prompt[0] for prompt, _ in reqs])
        return [([len(output)], [len(output) - 1], [0]) for _, output in reqs]
    totals = module.shuffled_totals(requests, 3, independent, curve)
    assert totals == [120.0 / (16.0 + 20.0 + 12.0)] * 3  # steps of 4, 6 and 2 tokens
    assert all(sorted(order) == [1, 2, 3] for order in seen_orders) and len(set(map(tuple, seen_orders))) > 1
    first = list(seen_orders)

    def learning(reqs: list) -> list:  # the first request decodes plainly, the others in one step
        seen_orders.append([prompt[0] for prompt, _ in reqs])
        return [([1] * len(output), [0] * len(output), [0] * len(output)) if i == 0 else
                ([len(output)], [len(output) - 1], [0]) for i, (_, output) in enumerate(reqs)]
    seen_orders.clear()
    again = module.shuffled_totals(requests, 3, learning, curve)
    assert seen_orders == first  # seeded
    by_first = {4: 120.0 / (40.0 + 20.0 + 12.0), 6: 120.0 / (16.0 + 60.0 + 12.0), 2: 120.0 / (16.0 + 20.0 + 20.0)}
    assert again == [by_first[{1: 4, 2: 6, 3: 2}[order[0]]] for order in first]


def test_trace_lines_put_the_optimum_and_auto_side_by_side() -> None:
    """auto_replay.py --trace: one line per output position, the optimum's and auto's steps where
    they start (auto's from its step sizes and accepted counts), padding shown as the size paid."""
    module = _benchmark_script("auto_replay")
    output = [1, 2, 3, 4, 5]
    lines = module.trace_lines(output, ["a", "b", "c", "d", "e"], [0, 3, 2, 1, 0],
                               [(1, 0, "unknown"), (4, 2, "lookup m4"), (1, 0, "unknown")],
                               [(0, 0, 1), (1, 2, 4), (4, 0, 1)])
    assert len(lines) == 5
    assert lines[0].split() == ["0", "L0", "+0", "d0", "a0", "'a'"]
    assert lines[1].split() == ["1", "L3", "+2", "(paid", "4)", "d3", "a2", "lookup", "m4", "'b'"]
    assert lines[2].split() == ["2", "L2", "'c'"]
    assert lines[4].split() == ["4", "L0", "+0", "d0", "a0", "'e'"]


def test_ngram_simple_model_drafts_as_the_tool_does() -> None:
    """auto_replay.ngram_simple_steps: llama.cpp's ngram-simple (12-token key, latest earlier
    occurrence, up to 48 drafted when at least 12 follow it), cut to the tool's budget of
    max_tokens - 2 - committed, and past it one unlimited draft that is counted but not decoded."""
    module = _benchmark_script("auto_replay")
    text = list(range(1000, 1100))  # 100 distinct tokens
    prompt = list(range(1, 40)) + text + list(range(2000, 2010)) + text[:12]
    # the output goes on with the text the last 12 prompt tokens started: a copy from text[12:]
    output = text[12:80] + [9000 + i for i in range(20)]
    sizes, drafted = module.ngram_simple_steps(prompt, output, max_tokens=192)
    # 48 drafted and taken with the target's next token; then 48 more, 19 of them taken (the
    # output leaves the text at text[80]); then no key of the new tokens is found
    assert sizes[:3] == [49, 49, 1] and drafted == 96
    assert sum(1 for k in sizes if k == 1) == len(sizes) - 2
    # a budget of 30 tokens (-n 29): the first draft is cut to 28; with no budget left the tool
    # drafts 48 past the end, counted, while the step decodes one token
    assert module.ngram_simple_steps(prompt, output[:30], max_tokens=30) == ([29, 1], 28 + 48)
    # no key of 12 tokens repeats: nothing drafted
    assert module.ngram_simple_steps(list(range(200)), [7] * 5, max_tokens=192) == ([1] * 5, 0)
