"""Per-token cost of the three ways into the engine, in instructions (valgrind's callgrind):
the engine alone (spec::Engine::generate from C++), the C API (pyspec_generate through
libpyspec) and the Python package (pyspec.Engine.generate). Instruction counts are repeatable on a
loaded machine where times are not.

Each program loads the tiny target as target and draft, generates from one prompt with one
thread, and runs twice, for SHORT and LONG tokens; (count(LONG) - count(SHORT)) / (LONG - SHORT) is
the cost of one generated token with loading, prefill and interpreter start cancelled out.

    python benchmarks/c_api_cost/run.py [--methods none chain] [--short 32] [--long 96] [--build DIR]

Builds libpyspec into DIR (default build/c_api_cost), installs it under DIR/prefix, and builds the two
C/C++ programs there; needs valgrind, cmake and the package installed (pip install -e .).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from pyspec._models.tiny import build_tiny_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def sh(*cmd: object) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def build(build_dir: Path) -> dict[str, list[str]]:
    site = sysconfig.get_paths()["purelib"]
    prefix = build_dir / "prefix"
    sh("cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={site}",
       f"-DCMAKE_INSTALL_PREFIX={prefix}", "-DCMAKE_INSTALL_LIBDIR=lib", "-DPYSPEC_BUILD_SHARED=ON")
    sh("cmake", "--build", build_dir, "--target", "pyspec", "spec", "-j2")
    sh("cmake", "--install", build_dir)
    llama = Path(site) / "lib"
    sh("g++", "-O2", "-std=c++17", f"-I{ROOT / 'engine/include'}", HERE / "engine_cost.cpp", build_dir / "libspec.a",
       build_dir / "libspec_core.a", f"-L{llama}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{llama}",
       "-o", build_dir / "engine_cost")
    sh("gcc", "-O2", f"-I{prefix / 'include'}", HERE / "c_api_cost.c", f"-L{prefix / 'lib'}", "-lpyspec",
       f"-Wl,-rpath,{prefix / 'lib'}", "-o", build_dir / "c_api_cost")
    return {"engine alone (C++)": [str(build_dir / "engine_cost")], "C API (C)": [str(build_dir / "c_api_cost")],
            "Python package": [sys.executable, str(HERE / "python_cost.py")]}


def instructions(cmd: list[str], model: Path, method: str, n_tokens: int) -> int:
    out = sh("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd, model, method, n_tokens)
    match = re.search(r"Collected : (\d+)", out)
    assert match and f"{n_tokens} tokens" in out, out[-2000:]
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["none", "chain"])
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--long", type=int, default=96)
    parser.add_argument("--build", type=Path, default=ROOT / "build" / "c_api_cost",
                        help="CMake build tree (an existing one only relinks)")
    args = parser.parse_args()
    args.build.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(args.build / "tiny.gguf", seed=0)
    programs = build(args.build.resolve())
    print(f"instructions per generated token (callgrind), tiny model, {args.short} -> {args.long} tokens")
    print("| method | path | instructions per token | over the engine alone |")
    print("|---|---|---:|---:|")
    for method in args.methods:
        base = None
        for name, cmd in programs.items():
            short = instructions(cmd, model, method, args.short)
            long = instructions(cmd, model, method, args.long)
            per_token = (long - short) / (args.long - args.short)
            base = per_token if base is None else base
            print(f"| {method} | {name} | {per_token:,.0f} | {per_token - base:+,.0f} ({100 * (per_token / base - 1):+.2f}%) |",
                  flush=True)


if __name__ == "__main__":
    main()
