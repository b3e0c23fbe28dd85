#!/usr/bin/env bash
# Issue #13's tables: pyspec `none` and `auto` against llama.cpp's own tools (plain decoding and
# its speculative modes) on five prompt suites, 20 prompts each, 192 new tokens, greedy, 2 threads,
# one process per suite. Needs the tools: python benchmarks/build_llama_cpp.py (once, ~10 min).
# Writes benchmarks/results/vs_llama_cpp_<suite>.{json,md,png}. Run it on an otherwise idle machine
# (README, "Benchmark", for what each column measures).
set -euo pipefail
out="$(dirname "$0")/results"
mkdir -p "$out"
methods="none,auto,llama.cpp,llama.cpp-ngram-simple,llama.cpp-ngram-map-k,llama.cpp-ngram-mod,llama.cpp-draft"
for suite in ${SUITES:-humaneval edit mtbench gsm8k longqa}; do
    pyspec bench --suite "$suite" --n "${N:-20}" --max-tokens "${MAX_TOKENS:-192}" --threads 2 \
        --methods "${METHODS:-$methods}" \
        --json "$out/vs_llama_cpp_$suite.json" --plot "$out/vs_llama_cpp_$suite.png" --no-progress \
        | tee "$out/vs_llama_cpp_$suite.md"
done
