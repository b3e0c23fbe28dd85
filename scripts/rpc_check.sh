#!/usr/bin/env bash
# Builds what llama.cpp's RPC backend needs and runs pyspec's RPC tests for real: a separate
# environment whose llama-cpp-python is built with -DGGML_RPC=on, ggml-rpc-server built from the
# same llama.cpp (`pyspec rpc-server --build`), then the loopback tests with PYSPEC_REQUIRE_RPC=1
# (a missing piece fails instead of skipping). About 15 minutes on 2 cores the first time (two
# llama.cpp builds); pip and pyspec's cache keep the results.
#
#   scripts/rpc_check.sh [VENV]        # default VENV: .venv-rpc
#
# Then, in that environment: python benchmarks/rpc_speed.py (docs/rpc.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-rpc}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q ".[test]"
if ! python -P -c 'import sys, pyspec; sys.exit(0 if pyspec.rpc_supported() else 1)'; then
    # --no-cache-dir: build it with RPC now, and leave pip's cached (CPU-only) wheel alone
    CMAKE_ARGS="-DGGML_RPC=on" pip install -q --force-reinstall --no-cache-dir --no-deps "llama-cpp-python==0.3.36"
fi
pyspec rpc-server --build --build-only
PYSPEC_REQUIRE_RPC=1 pytest -q tests/test_rpc.py tests/test_c_api.py -k "rpc"
