#!/usr/bin/env bash
# ASan + UBSan run: the C++ unit tests (tests/cpp, ctest) and the Python tests on the tiny models,
# with the engine, the pure algorithms and the binding compiled with -fsanitize=address,undefined.
# llama.cpp itself (llama-cpp-python's libllama) is used as installed, uninstrumented.
#
#   scripts/sanitize.sh                  # everything (C++ tests, then the Python tests)
#   scripts/sanitize.sh cpp              # the C++ tests only
#   scripts/sanitize.sh python [ARGS]    # the Python tests only; ARGS go to pytest
#
# Needs the environment the tests need (pip install -e ".[test]" or ".[test]"), gcc/clang with
# the sanitizer runtimes, and runs under /work/tools/heavy on the shared development machine.
# Any sanitizer report stops the process that hit it (halt_on_error / abort_on_error), which fails
# that test; the script ends with the number of reports found in the logs (0 when clean).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python}
BUILD=${SANITIZE_BUILD:-$ROOT/build/sanitize}
WHAT=${1:-all}
[ $# -gt 0 ] && shift
mkdir -p "$BUILD"
LOGS=$BUILD/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NANOBIND=$($PY -m nanobind --cmake_dir)
MODEL=$BUILD/tiny.gguf
$PY -c "from pyspec._models.tiny import build_tiny_model; build_tiny_model('$MODEL', seed=0)" 2>/dev/null ||
  PYTHONPATH=$ROOT $PY -c "import sys; sys.path.insert(0, 'models'); from tiny import build_tiny_model; build_tiny_model('$MODEL', seed=0)"

echo "== configure and build (sanitized) in $BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" -DCMAKE_MODULE_LINKER_FLAGS="$SAN" \
  -DPYSPEC_BUILD_TESTS=ON -DPYSPEC_TEST_MODEL="$MODEL" \
  -DSKBUILD=ON -DCMAKE_PREFIX_PATH="$SITE;$NANOBIND" -DPython_EXECUTABLE="$(command -v "$PY")" >"$LOGS/configure.txt"
cmake --build "$BUILD" -j2 --target test_verify test_lookup test_tree test_phrase_pool test_schedule test_cost_model \
  test_pool_file test_model _core >"$LOGS/build.txt"

# Reports stop the process; leaks are checked in the C++ tests (the interpreter keeps objects
# alive on purpose at exit, so not under Python).
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0

if [ "$WHAT" = all ] || [ "$WHAT" = cpp ]; then
  echo "== C++ unit tests under ASan + UBSan (leak checking on)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest --test-dir "$BUILD" --output-on-failure \
    >"$LOGS/ctest.txt" 2>&1 || status=1
  tail -n 3 "$LOGS/ctest.txt"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = python ]; then
  echo "== Python tests on the tiny models with the sanitized extension"
  # A package tree of the sources plus the sanitized _core, first on the path. An editable
  # install's import hook would still redirect `pyspec` to the regular build: sitecustomize
  # removes that hook for this run only.
  STAGE=$BUILD/stage
  rm -rf "$STAGE"
  mkdir -p "$STAGE"
  cp -r pyspec "$STAGE/pyspec"
  mkdir -p "$STAGE/pyspec/_models"
  cp models/*.py models/*.json "$STAGE/pyspec/_models/"
  cp "$BUILD"/_core*.so "$STAGE/pyspec/"
  cat >"$STAGE/sitecustomize.py" <<'EOF'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
EOF
  RUNTIME=$(${CXX:-c++} -print-file-name=libasan.so)
  export PYTHONPATH=$STAGE
  export LD_LIBRARY_PATH=$SITE/llama_cpp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
  # From the stage: `python -c` and `python -m` put the working directory first on sys.path, and
  # the repository root would give the source tree (without any _core).
  cd "$STAGE"
  LD_PRELOAD=$RUNTIME $PY -c "
import pyspec._core as core, sys
assert core.__file__.startswith('$STAGE'), core.__file__
print('sanitized extension:', core.__file__)"
  nm -D "$STAGE"/pyspec/_core*.so | grep -q __asan_report || { echo "the staged _core is not instrumented"; exit 1; }
  LD_PRELOAD=$RUNTIME $PY -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" \
    -m "not model" --deselect tests/test_cpp.py::test_cpp_unit_tests "$ROOT/tests" \
    "$@" >"$LOGS/pytest.txt" 2>&1 || status=1
  cd "$ROOT"
  tail -n 3 "$LOGS/pytest.txt"
fi

findings=$(cat "$LOGS"/*.txt | grep -c -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" || true)
echo "== sanitizer reports: $findings (logs in $LOGS)"
[ "$findings" -eq 0 ] || status=1
exit $status
