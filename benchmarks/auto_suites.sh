#!/usr/bin/env bash
# Method auto against plain decoding and llama-cpp-python's peers (docs/results-speed.md, "Against
# llama-cpp-python") on four prompt suites, 20 prompts each, 128 new tokens, greedy, 2 threads, one process per suite.
# Writes benchmarks/results/auto_<suite>.{json,md,png}. Takes about 1.5 hours on the 2-core
# development machine; run it on an otherwise idle machine.
set -euo pipefail
out="$(dirname "$0")/results"
mkdir -p "$out"
for suite in ${SUITES:-humaneval edit mtbench gsm8k}; do
    pyspec bench --suite "$suite" --n "${N:-20}" --max-tokens "${MAX_TOKENS:-128}" --threads 2 \
        --methods "${METHODS:-none,auto,peer-llama-cpp,peer-pld}" \
        --json "$out/auto_$suite.json" --plot "$out/auto_$suite.png" --no-progress | tee "$out/auto_$suite.md"
done
