#!/usr/bin/env bash
# pyspec `none` and `auto` against llama.cpp's own tools (plain decoding and its three n-gram
# speculative modes), one `pyspec bench` process per suite: the tables of docs/results-speed.md.
# 20 prompts a suite, 192 new tokens, greedy, 2 threads. Needs the tools once:
# python benchmarks/build_llama_cpp.py (~10 min). Run it on an otherwise idle machine, after
# `pyspec calibrate --force --threads 2`.
#
#   TAG=mymachine bash benchmarks/vs_llama_cpp.sh        # writes results/vs_llama_cpp_<suite>_mymachine.{md,json,png}
#   SUITES="mtbench" REPEATS=3 TAG=x bash benchmarks/vs_llama_cpp.sh
#   python benchmarks/vs_llama_cpp_summary.py benchmarks/results/vs_llama_cpp_*_mymachine.json
#
# Environment: SUITES (default: humaneval edit longedit mtbench gsm8k), N (20), MAX_TOKENS (192),
# REPEATS (1), METHODS (the six below), TAG (local), EXTRA (more `pyspec bench` flags, e.g.
# "--temperature 0.7" or "--ngram default").
set -euo pipefail
out="$(dirname "$0")/results"
mkdir -p "$out"
methods="none,auto,llama.cpp,llama.cpp-ngram-simple,llama.cpp-ngram-map-k,llama.cpp-ngram-mod"
tag="${TAG:-local}"
for suite in ${SUITES:-humaneval edit longedit mtbench gsm8k}; do
    name="$out/vs_llama_cpp_${suite}_$tag"
    # shellcheck disable=SC2086
    pyspec bench --suite "$suite" --n "${N:-20}" --max-tokens "${MAX_TOKENS:-192}" --threads 2 \
        --repeats "${REPEATS:-1}" --methods "${METHODS:-$methods}" ${EXTRA:-} \
        --json "$name.json" --plot "$name.png" --no-progress | tee "$name.md"
done
