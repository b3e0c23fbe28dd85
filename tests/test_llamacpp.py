"""llama.cpp's own tools as bench peers: reading their real output, finding and building them,
the skip when they are missing, and (when they are built) a real run on the tiny models.

tests/data/llama_cpp holds output captured verbatim from llama-completion and
llama-speculative-simple built from llama.cpp 0c1e570 (Qwen2.5-Coder 1.5B, 2 threads, greedy):
a run that an end token stopped and one that the length limit stopped, for each tool.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pyspec.bench import llamacpp
from pyspec.bench import parse_methods, run_bench
from pyspec.bench.report import format_markdown
from pyspec.fetch import Cache
from pyspec.bench.llamacpp import LlamaCppToolsError, LlamaCppToolsMissing, find_tools
from pyspec.bench.llamacpp_run import (IncompleteOutput, ToolSettings, completion_args, parse_completion, parse_speculative,
                                 speculative_args, tool_env)

from test_cli import pyspec_cli

CAPTURED = Path(__file__).parent / "data" / "llama_cpp"


def _captured(name: str) -> tuple[bytes, str]:
    return (CAPTURED / f"{name}.stdout").read_bytes(), (CAPTURED / f"{name}.stderr").read_text(encoding="utf-8")


# -- reading the tools' output -----------------------------------------------------------------


def test_parse_completion_stopped_by_an_end_token() -> None:
    run = parse_completion(*_captured("completion_stop"), max_tokens=16)
    assert run.text == "yes" and run.finish_reason == "stop" and not run.special_rendered
    # "yes", then the end token: one decode (of "yes"), one generated token as pyspec counts
    assert run.n_generated == 1 and run.n_prompt_tokens == 17
    assert run.decode_s == pytest.approx(2.18709) and run.decode_tokens_per_second == pytest.approx(0.46)
    assert run.decode_tokens_per_second_within_limit == run.decode_tokens_per_second
    assert run.wall_s == pytest.approx(4.30942)
    assert run.n_drafted is None


def test_parse_completion_stopped_by_the_length_limit() -> None:
    run = parse_completion(*_captured("completion_len"), max_tokens=12)
    assert run.text == "```python\nfrom typing import List\n\n\ndef has_close_elements"
    assert run.finish_reason == "length" and run.n_generated == 12 and run.n_prompt_tokens == 148
    assert run.decode_tokens_per_second == pytest.approx(7.20) and run.wall_s == pytest.approx(6.93049)


def test_parse_speculative_stopped_by_an_end_token() -> None:
    stdout, stderr = _captured("speculative_stop")
    run = parse_speculative(stdout, stderr, (CAPTURED / "prompt_short.txt").read_bytes(), max_tokens=16)
    assert run.text == "yes" and run.special_rendered and run.n_prompt_tokens == 17
    # the tool's own count: "yes" and the end token
    assert run.n_generated == 2 and run.finish_reason == "stop"
    assert run.decode_s == pytest.approx(1.180) and run.decode_tokens_per_second == pytest.approx(1.694)
    assert run.wall_s == pytest.approx(6.528 + 1.180)
    assert (run.n_drafted, run.n_accepted) == (0, 0)


def test_parse_speculative_stopped_by_the_length_limit() -> None:
    stdout, stderr = _captured("speculative_len")
    run = parse_speculative(stdout, stderr, (CAPTURED / "prompt_humaneval0.txt").read_bytes(), max_tokens=12)
    assert run.text == "```python\nfrom typing import List\n\n\ndef has_close_elements"
    assert run.n_generated == 12 and run.finish_reason == "length" and run.n_prompt_tokens == 148
    assert run.decode_tokens_per_second == pytest.approx(7.074)
    # the last blank line lost at exit: the text reads the same
    assert parse_speculative(stdout[:-2], stderr, (CAPTURED / "prompt_humaneval0.txt").read_bytes(), 12).text == run.text


def test_lost_log_lines_are_incomplete_output_and_a_wrong_echo_is_not() -> None:
    stdout, stderr = _captured("completion_len")
    cut = stderr[: stderr.index("common_perf_print:        eval time")]
    with pytest.raises(IncompleteOutput, match="eval time"):
        parse_completion(stdout, cut, 12)
    with pytest.raises(IncompleteOutput):
        parse_completion(b"", "", 12)
    stdout, stderr = _captured("speculative_len")
    with pytest.raises(IncompleteOutput, match="decoded"):
        parse_speculative(stdout, stderr[: stderr.index("decoded")], b"", 12)
    with pytest.raises(LlamaCppToolsError, match="prompt it echoed") as info:
        parse_speculative(stdout, stderr, b"another prompt", 12)
    assert not isinstance(info.value, IncompleteOutput)
    prompt = (CAPTURED / "prompt_humaneval0.txt").read_bytes()
    assert parse_speculative(stdout, stderr, prompt, 12).n_generated > 0
    # an extra blank line ahead of the right echo (seen once in the test suite): run again
    with pytest.raises(IncompleteOutput, match="not after exactly one blank line"):
        parse_speculative(b"\n\n" + stdout, stderr, prompt, 12)
    # both blank lines after the text lost (a tool run seen once in the test suite): run again
    with pytest.raises(IncompleteOutput, match="does not end with the blank line"):
        parse_speculative(stdout.rstrip(b"\n"), stderr, prompt, 12)
    stdout, stderr = _captured("completion_len")
    with pytest.raises(IncompleteOutput, match="does not end with the blank line"):
        parse_completion(stdout.rstrip(b"\n"), stderr, 12)


def test_tool_arguments_carry_the_engine_settings(tmp_path: Path) -> None:
    settings = ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=False)
    args = completion_args(settings, tmp_path / "p.txt", 192)
    joined = " ".join(args)
    for expected in ("-m t.gguf", "--temp 0", "-t 2", "-tb 2", "-c 4096", "-ub 512", "-fa off", "-n 192",
                     "-no-cnv", "--no-display-prompt", "--no-escape", f"-bf {tmp_path / 'p.txt'}", "--no-repack"):
        assert expected in joined, expected
    args = speculative_args(ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=True), tmp_path / "p.txt",
                            192, "draft-simple", draft="d.gguf", n_draft=4)
    joined = " ".join(args)
    # -n N generates at least N + 1 tokens; the draft is the same GGUF pyspec uses
    assert "-n 191" in joined and "--spec-type draft-simple" in joined and "-md d.gguf" in joined
    assert "--spec-draft-n-max 4" in joined and "--no-repack" not in joined
    # sampling: plain temperature sampling from the seed, the tools' top-k, top-p and min-p off
    sampled = ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=True, temperature=0.7, seed=5)
    for args in (completion_args(sampled, tmp_path / "p.txt", 192),
                 speculative_args(sampled, tmp_path / "p.txt", 192, "ngram-mod")):
        joined = " ".join(args)
        assert "--temp 0.7 --top-k 0 --top-p 1 --min-p 0 --seed 5" in joined and "--temp 0 " not in joined
    assert "--seed" not in " ".join(completion_args(settings, tmp_path / "p.txt", 192))
    unseeded = ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=True, temperature=0.7)
    joined = " ".join(completion_args(unseeded, tmp_path / "p.txt", 192))
    assert "--temp 0.7 --top-k 0 --top-p 1 --min-p 0" in joined and "--seed" not in joined  # the tool's own seed


# -- finding and building the tools ------------------------------------------------------------


def _fake_tools(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for tool in llamacpp.TOOLS:
        path = directory / tool
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def test_tools_get_huge_pages_as_the_engine_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's huge-page tunable is added to what GLIBC_TUNABLES holds (replacing an earlier
    hugetlb value), LLAMA_* variables are dropped, and huge_pages=False leaves the tunables alone."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0")
    monkeypatch.setenv("LLAMA_ARG_THREADS", "7")
    settings = ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=True)
    env = tool_env(settings)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert "LLAMA_ARG_THREADS" not in env
    off = tool_env(ToolSettings(model="t.gguf", n_ctx=4096, n_threads=2, repack=True, huge_pages=False))
    assert off["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert tool_env(settings)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_find_tools_says_how_to_build_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(llamacpp.BIN_ENV, raising=False)
    cache = Cache(tmp_path / "cache")
    with pytest.raises(LlamaCppToolsMissing, match=r"llama-completion, llama-speculative-simple, llama-bench "
                                                    r"missing in .*llama\.cpp/0c1e570(-noamx)?/bin.*build_llama_cpp\.py"):
        find_tools(cache=cache)
    built = _fake_tools(llamacpp.tools_dir(Cache(tmp_path / "built")))
    assert find_tools(cache=Cache(tmp_path / "built")) == built
    monkeypatch.setenv(llamacpp.BIN_ENV, str(_fake_tools(tmp_path / "elsewhere")))
    assert find_tools(cache=cache) == tmp_path / "elsewhere"
    with pytest.raises(LlamaCppToolsMissing, match="given"):
        find_tools(tmp_path / "nothing here")


def test_build_without_cmake_or_compiler_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PYSPEC_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LlamaCppToolsError, match="cmake and a C\\+\\+ compiler .* not found"):
        llamacpp.build_tools(Cache(tmp_path / "cache"))
    assert llamacpp.main([]) == 1
    assert "llama.cpp tools not built: cannot build llama.cpp's tools: cmake" in capsys.readouterr().err
    assert not (tmp_path / "cache" / "packages").exists()  # nothing downloaded


def test_build_reuses_built_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no cmake: a build would fail
    cache = Cache(tmp_path / "cache")
    built = _fake_tools(llamacpp.tools_dir(cache))
    assert llamacpp.build_tools(cache) == built


def test_llama_server_is_found_built_or_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(llamacpp.SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no cmake: a build would fail
    cache = Cache(tmp_path / "cache")
    with pytest.raises(LlamaCppToolsMissing, match=r"llama-server not found at .*/server/llama-server .*--server"):
        llamacpp.find_llama_server(cache)
    with pytest.raises(LlamaCppToolsError, match="cmake"):
        llamacpp.build_llama_server(cache)
    monkeypatch.setenv("PYSPEC_CACHE", str(tmp_path / "cache"))
    assert llamacpp.main(["--server"]) == 1
    assert "llama.cpp llama-server not built: cannot build" in capsys.readouterr().err
    server = llamacpp.server_dir(cache) / llamacpp.SERVER
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    assert llamacpp.build_llama_server(cache) == server == llamacpp.find_llama_server(cache)
    monkeypatch.setenv(llamacpp.SERVER_ENV, str(tmp_path / "missing"))
    with pytest.raises(LlamaCppToolsMissing, match=r"\$PYSPEC_LLAMA_SERVER"):
        llamacpp.find_llama_server(cache)


def test_a_corrupt_cached_sdist_is_replaced_and_a_failed_download_explained(tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    packages.mkdir()
    (packages / llamacpp.SDIST_NAME).write_bytes(b"not the sdist")
    index = tmp_path / "empty-index"
    index.mkdir()
    with pytest.raises(LlamaCppToolsError, match="pip could not download llama-cpp-python==0.3.36"):
        llamacpp.download_sdist(packages, pip_args=["--no-index", "--find-links", str(index)])
    assert not (packages / llamacpp.SDIST_NAME).exists()


# -- in `pyspec bench` -------------------------------------------------------------------------


def test_llama_cpp_methods_parse() -> None:
    specs = parse_methods("auto,llama.cpp,llama.cpp-ngram-mod,llama.cpp-draft:4,llama.cpp-draft", n_draft=6)
    assert [(m.label, m.name, m.n_draft, m.is_llama_cpp) for m in specs] == [
        ("none", "none", None, False), ("auto", "auto", 6, False), ("llama.cpp", "llama.cpp", None, True),
        ("llama.cpp-ngram-mod", "llama.cpp-ngram-mod", None, True), ("llama.cpp-draft:4", "llama.cpp-draft", 4, True),
        ("llama.cpp-draft", "llama.cpp-draft", None, True)]
    with pytest.raises(ValueError, match="takes no ':K'"):
        parse_methods("llama.cpp-ngram-simple:8")


def test_bench_skips_missing_tools_with_the_reason(tiny_target: str, tmp_path: Path) -> None:
    report = run_bench(tiny_target, None, ["hello hello"], max_tokens=4, methods="none,llama.cpp,llama.cpp-ngram-mod",
                       n_threads=2, n_ctx=256, progress=False, warmup=False, llama_cpp_bin=str(tmp_path))
    assert report.methods == ["none"] and set(report.skipped) == {"llama.cpp", "llama.cpp-ngram-mod"}
    assert all("build_llama_cpp.py" in why for why in report.skipped.values())
    table = format_markdown(report)
    assert "Skipped:\n- llama.cpp: llama.cpp tools not found" in table
    p = pyspec_cli("bench", "--target", tiny_target, "--prompt", "hi", "--max-tokens", "2", "--methods", "llama.cpp",
                   "--threads", "2", "--llama-cpp-bin", str(tmp_path), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "pyspec bench: skipped llama.cpp: llama.cpp tools not found" in p.stderr and "Traceback" not in p.stderr
    assert "| none |" in p.stdout


def _built_tools() -> Path | None:
    try:
        return find_tools()
    except LlamaCppToolsMissing:
        return None


@pytest.mark.skipif(_built_tools() is None, reason="llama.cpp's tools are not built (benchmarks/build_llama_cpp.py)")
def test_real_tools_on_the_tiny_models(tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    """Every llama.cpp peer runs, reads the prompt as the same number of tokens as the engine,
    and generates none's text (the tiny f32 model has no near-ties)."""
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "the cat sat on the mat, the cat sat on the"]
    methods = "none,llama.cpp,llama.cpp-ngram-simple,llama.cpp-ngram-map-k,llama.cpp-ngram-mod,llama.cpp-draft:2"
    report = run_bench(tiny_target, tiny_drafts["perturbed"], prompts, max_tokens=16, methods=methods, n_threads=2,
                       n_ctx=512, progress=False, settle_s=0.25)  # (3 s by default with tools: 18 runs here)
    assert report.methods == methods.split(",") and not report.skipped and report.settle_s == 0.25
    assert "0.25 s pause before each run" in format_markdown(report).splitlines()[0]
    assert report.llama_cpp_modes == methods.split(",")[1:]
    none = report.result("none")
    assert none is not None
    for r in report.results:
        assert r.greedy_identical == len(prompts), (r.method, [x.divergence_index for x in r.per_prompt])
        assert r.decode_tokens_per_second is not None and r.decode_tokens_per_second > 0
        for x, ref in zip(r.per_prompt, none.per_prompt):
            assert x.n_prompt_tokens == ref.n_prompt_tokens
            assert x.decode_tokens_per_second_within_limit is not None, r.method
            if r.method != "none":
                assert x.text and x.process_wall_s is not None and x.process_wall_s >= x.wall_s
                assert x.n_generated >= ref.n_generated  # speculative-simple may run past the limit
    draft = report.result("llama.cpp-draft:2")
    assert draft is not None and draft.n_draft == 2 and draft.acceptance_rate is not None
    assert set(report.best_llama_cpp_mode) == {"custom/0", "custom/1"}
    assert none.decode_speedup_vs_llama_cpp is not None and report.none_vs_llama_cpp == none.decode_speedup_vs_llama_cpp
    assert "Against llama.cpp's own tools" in format_markdown(report)


@pytest.mark.skipif(_built_tools() is None, reason="llama.cpp's tools are not built (benchmarks/build_llama_cpp.py)")
def test_real_tools_sample_from_the_seed(tiny_target: str) -> None:
    """With a temperature the tools sample: the same seed gives the same text, another seed or
    greedy decoding another."""
    def texts(temperature: float, seed: int) -> list[str | None]:
        report = run_bench(tiny_target, None, ["the cat sat on the mat, the cat sat on the"], max_tokens=10,
                           methods="none,llama.cpp,llama.cpp-ngram-mod", n_threads=2, n_ctx=512, progress=False,
                           settle_s=0.1, temperature=temperature, seed=seed)
        assert all(r.decode_tokens_per_second for r in report.results)
        return [r.per_prompt[0].text for r in report.results[1:]]

    first, again, other, greedy = texts(1.0, 3), texts(1.0, 3), texts(1.0, 4), texts(0.0, 3)
    assert first == again and all(first) and first != other and first != greedy


def test_speculative_run_past_the_limit_and_its_speed_within_it() -> None:
    """A real -lv 5 run (ngram-mod, -n 63 for 64 tokens; excerpt: the lines the parser reads):
    24 plain steps, one bounded draft (38/38) reaching 63 tokens, then the last step's unbounded
    draft (58/64) taking the run to 122 tokens."""
    stdout, stderr = _captured("speculative_overshoot")
    run = parse_speculative(stdout, stderr, (CAPTURED / "prompt_humaneval0.txt").read_bytes(), max_tokens=64)
    assert run.n_generated == 122 and run.finish_reason == "length"
    assert run.decode_tokens_per_second == pytest.approx(5.838)
    # 63 tokens up to the 38/38 step logged at 0.34.950.343; the loop started 20.898 s before
    # the `decoded` line (0.40.526.618)
    assert run.decode_tokens_per_second_within_limit == pytest.approx(63 / (34.950343 - (40.526618 - 20.898)))
    assert run.text.startswith("```python\nfrom typing import List") and run.text.endswith('"""\n   ')
    # without the debug lines (the other captures), no within-limit figure
    stdout, stderr = _captured("speculative_len")
    assert parse_speculative(stdout, stderr, (CAPTURED / "prompt_humaneval0.txt").read_bytes(), 12
                             ).decode_tokens_per_second_within_limit is None
