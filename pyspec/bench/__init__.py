"""Benchmarking: pyspec's decoding methods beside their peers on one prompt suite, in one run.

- `runner`: `run_bench`, the side-by-side run (`pyspec bench`), and the method specs it takes.
- `report`: what a run measured (`BenchReport`, `PromptRun`), its ratios, Markdown, JSON, plots.
- `peers`: llama-cpp-python and llama.cpp's own tools as peers.
- `llamacpp`, `llamacpp_run`: building llama.cpp's tools from the pinned source, running them and
  reading their reports.
"""

from .report import (BenchReport, MethodSummary, PromptRun, format_markdown, plot, plot_panels, read_json,
                     ratio_interval, runs_from_report, versus_best_llama_cpp, versus_best_suite_llama_cpp,
                     write_json)
from .runner import (ENGINE_N_BATCH, SETTLE_S, MethodSpec, available_methods, decode_tokens_per_second, median_run,
                     parse_methods, run_bench, suite_prompts)

__all__ = [
    "BenchReport", "ENGINE_N_BATCH", "MethodSpec", "MethodSummary", "PromptRun", "SETTLE_S", "available_methods",
    "decode_tokens_per_second", "format_markdown", "median_run", "parse_methods", "plot", "plot_panels", "read_json",
    "ratio_interval", "run_bench", "runs_from_report", "suite_prompts", "versus_best_llama_cpp",
    "versus_best_suite_llama_cpp", "write_json",
]
