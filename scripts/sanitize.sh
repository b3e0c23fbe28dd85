#!/usr/bin/env bash
# ASan + UBSan run: the C++ unit tests (tests/cpp, ctest) and the Python tests on the tiny models,
# with the engine, the pure algorithms and the binding compiled with -fsanitize=address,undefined.
# llama.cpp itself (llama-cpp-python's libllama) is used as installed, uninstrumented.
#
#   scripts/sanitize.sh                  # everything (C++ tests, then the Python tests)
#   scripts/sanitize.sh cpp              # the C++ tests only (test_c_api among them)
#   scripts/sanitize.sh capi             # the C API's boundary test only (tests/cpp/test_c_api.cpp)
#   scripts/sanitize.sh python [ARGS]    # the Python tests only; ARGS go to pytest (test paths
#                                        # relative to the repository, e.g. tests/test_auto.py)
#
# Needs the environment the tests need (pip install -e ".[test]" or ".[test]"), gcc/clang with
# the sanitizer runtimes. CPU-heavy, but not a timing.
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
OTHER_VOCAB=$BUILD/tiny_other_vocab.gguf  # the C API's wrong-vocabulary case
BUILD_MODELS="build_tiny_model('$MODEL', seed=0); build_tiny_model('$OTHER_VOCAB', seed=0, n_merges=150)"
$PY -c "from pyspec._models.tiny import build_tiny_model; $BUILD_MODELS" 2>/dev/null ||
  PYTHONPATH=$ROOT $PY -c "import sys; sys.path.insert(0, 'models'); from tiny import build_tiny_model; $BUILD_MODELS"

echo "== configure and build (sanitized) in $BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" -DCMAKE_MODULE_LINKER_FLAGS="$SAN" \
  -DPYSPEC_BUILD_TESTS=ON -DPYSPEC_TEST_MODEL="$MODEL" \
  -DPYSPEC_BUILD_SHARED=ON -DPYSPEC_TEST_OTHER_VOCAB_MODEL="$OTHER_VOCAB" \
  -DSKBUILD=ON -DCMAKE_PREFIX_PATH="$SITE;$NANOBIND" -DPython_EXECUTABLE="$(command -v "$PY")" >"$LOGS/configure.txt"
if [ "$WHAT" = capi ]; then
  cmake --build "$BUILD" -j2 --target test_c_api >"$LOGS/build.txt"
else
  cmake --build "$BUILD" -j2 --target test_verify test_lookup test_tree test_phrase_pool test_schedule test_cost_model \
    test_pool_file test_model test_model_faults test_c_api _core >"$LOGS/build.txt"
fi

# Reports stop the process; leaks are checked in the C++ tests (the interpreter keeps objects
# alive on purpose at exit, so not under Python).
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0

if [ "$WHAT" = all ] || [ "$WHAT" = cpp ]; then
  echo "== C++ unit tests under ASan + UBSan (leak checking on)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest --test-dir "$BUILD" -E '^test_model_faults$' \
    --output-on-failure >"$LOGS/ctest.txt" 2>&1 || status=1
  tail -n 3 "$LOGS/ctest.txt"
  # test_model_faults makes allocations fail inside llama.cpp's model and context creation: the
  # uninstrumented libllama then leaks small blocks (24 blocks, 3.9 KB over the test's 56 failed
  # constructions), which the test bounds itself (its heap check); leak checking stays on for the
  # engine's own code above.
  echo "== test_model_faults under ASan + UBSan (leaks measured by the test)"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ctest --test-dir "$BUILD" -R '^test_model_faults$' \
    --output-on-failure >"$LOGS/ctest_faults.txt" 2>&1 || status=1
  tail -n 3 "$LOGS/ctest_faults.txt"
fi

if [ "$WHAT" = capi ]; then
  echo "== the C API's boundary test under ASan + UBSan (leak checking on)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest --test-dir "$BUILD" -R '^test_c_api$' --output-on-failure \
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
  # The ASan runtime first, then libstdc++: ASan's interceptor of __cxa_throw looks up the real
  # one when the runtime starts, and the interpreter does not link libstdc++ (the extension loads
  # it later), so without it the first C++ exception stops the process with "AddressSanitizer:
  # CHECK failed ... real___cxa_throw" instead of becoming a Python exception.
  RUNTIME="$(${CXX:-c++} -print-file-name=libasan.so) $(${CXX:-c++} -print-file-name=libstdc++.so.6)"
  export PYTHONPATH=$STAGE
  export LD_LIBRARY_PATH=$SITE/llama_cpp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # pytest captures the tests' stderr at the file-descriptor level, and a process that aborts takes
  # that captured output with it, so the reports must go elsewhere: ASan's to files (log_path, one
  # per process, child processes included), UBSan's (which ignores log_path when it runs inside
  # ASan) to the pytest log, with pytest capturing only Python's sys.stderr (--capture=sys).
  # Child processes' stderr is read by the tests that start them, which fail on the abort.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$LOGS/asan
  export UBSAN_OPTIONS=$UBSAN_OPTIONS:abort_on_error=1
  # From the stage: `python -c` and `python -m` put the working directory first on sys.path, and
  # the repository root would give the source tree (without any _core).
  cd "$STAGE"
  LD_PRELOAD=$RUNTIME $PY -c "
import pyspec._core as core, sys
assert core.__file__.startswith('$STAGE'), core.__file__
print('sanitized extension:', core.__file__)"
  # grep without -q: with pipefail, -q's early exit would fail the pipeline on nm's SIGPIPE.
  nm -D "$STAGE"/pyspec/_core*.so | grep __asan_report >/dev/null || { echo "the staged _core is not instrumented"; exit 1; }
  # Test paths in ARGS are relative to the repository (pytest runs from the stage); without any,
  # the whole of tests/.
  args=()
  paths=0
  for a in "$@"; do
    if [[ $a != -* && -e $ROOT/${a%%::*} ]]; then args+=("$ROOT/$a"); paths=1; else args+=("$a"); fi
  done
  [ $paths = 1 ] || args+=("$ROOT/tests")
  LD_PRELOAD=$RUNTIME $PY -m pytest -q -p no:cacheprovider --capture=sys --rootdir "$ROOT" -c "$ROOT/pyproject.toml" \
    -m "not model" --deselect tests/test_cpp.py::test_cpp_unit_tests "${args[@]}" >"$LOGS/pytest.txt" 2>&1 || status=1
  cd "$ROOT"
  tail -n 3 "$LOGS/pytest.txt"
fi

# A report, or a failed internal check of a sanitizer runtime (which also stops the process).
findings=$(cat "$LOGS"/* | grep -c -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|Sanitizer: CHECK failed" || true)
echo "== sanitizer reports: $findings (logs in $LOGS)"
[ "$findings" -eq 0 ] || status=1
exit $status
