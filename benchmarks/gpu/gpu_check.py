#!/usr/bin/env python3
"""Build, test and measure pyspec on a CUDA machine that has no network, by one script.

Two steps, on two machines:

    # 1. here, with the network: everything the GPU machine needs, ~8 MB (+ model parts)
    python benchmarks/gpu/gpu_check.py pack [--model smollm2-135m-instruct]
    # 2. on the GPU machine, from a pyspec checkout holding .gpu/ (offline)
    python3 benchmarks/gpu/gpu_check.py run [--steps build,test,shapes,plan,real]
    # the same on this CPU (no CUDA), e.g. in CI: small shapes, two test files
    python benchmarks/gpu/gpu_check.py pack --quick && python benchmarks/gpu/gpu_check.py run --cpu --quick

`pack` writes .gpu/carry/: the llama.cpp tree vendored in the pinned llama-cpp-python sdist
(commit 0c1e570), trimmed to what libllama's CPU and CUDA build needs (tar.xz); the pure-Python
wheels the build and the tests need beyond a CUDA image's Python (gguf, nanobind,
scikit-build-core); the real target's and draft's shapes and tensor types (a few kB, to write
random models of their size there); this CPU's cost curves for them, to print beside the GPU's;
and prompts. With --model it also splits that registry model into .gpu/model-part<i>/ (at most
--part-mb each), to be carried one part per call.

`run` (each step is skipped when its output is already there, so a warm machine resumes):
- build:  libllama from that tree with CUDA (all layers offloadable; `--cpu`: the CPU backend),
          installed under .gpu/work, and pyspec built against it into .gpu/work/site-<backend>;
- test:   the engine's tests on tiny models with every layer offloaded (PYSPEC_N_GPU_LAYERS=-1):
          greedy identity, the chi-square sampling tests, trees, pools, reload, auto; and a check
          that llama.cpp reports the layers on the GPU;
- shapes: random-weight models of the real target's and draft's shapes and tensor types;
- plan:   their cost curves (`Engine.calibrate`), beside this CPU's, and what auto plans with
          each: a draft-model chain's length and expected speed-up, and a free (lookup) draft's;
- real:   when the model parts are here, tokens/s of every method that needs no draft model
          against `none` on real prompts; and the time of their real steps by size against a
          one-token step and against the calibrated curve, with the rows' argmax on the host and
          on the backend (backend_argmax).
Results go to --out (default $OUT, else .gpu/out): a log, curves.json, plan.md, tests.log,
real.md / real.json, steps.md / steps.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
try:
    import gguf  # noqa: F401  (shape_model needs it; a CUDA image's Python may lack it)
except ImportError:  # then the wheel `pack` carried, importable as a zip (pure Python)
    sys.path[:0] = [str(w) for w in sorted((REPO / ".gpu" / "carry" / "wheels").glob("gguf-*.whl"))]

from gpu_steps import (  # noqa: E402
    STEPS, Layout, RunContext, build_step, plan_step, real_step, shapes_step, test_step)
from gpu_pack import pack  # noqa: E402

log = logging.getLogger("gpu_check")


def _default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) if out else REPO / ".gpu" / "out"


def _cmd_pack(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir))
    pack(layout, model=args.model, quick=args.quick, part_mb=args.part_mb, cpu_reference=not args.no_cpu_reference)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir))
    out = Path(args.out) if args.out else _default_out()
    out.mkdir(parents=True, exist_ok=True)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"gpu_check: unknown step(s) {', '.join(unknown)}; steps are {', '.join(STEPS)}", file=sys.stderr)
        return 2
    ctx = RunContext(layout=layout, out=out, cuda=not args.cpu, quick=args.quick, jobs=args.jobs or os.cpu_count() or 1,
                     cuda_arch=args.cuda_arch, repo=REPO)
    handler = logging.FileHandler(out / "gpu_check.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logging.getLogger().addHandler(handler)
    log.info("gpu_check run: backend %s, steps %s, %s, Python %s", "CUDA" if ctx.cuda else "CPU", ",".join(steps),
             platform.machine(), platform.python_version())
    runners = {"build": build_step, "test": test_step, "shapes": shapes_step, "plan": plan_step, "real": real_step}
    failed = []
    for step in steps:
        start = time.monotonic()
        log.info("== %s", step)
        try:
            ok = runners[step](ctx)
        except Exception as e:  # one step's failure is reported, the steps after it that can still run do
            log.exception("step %s failed: %s", step, e)
            ok = False
        log.info("== %s %s in %.0f s", step, "done" if ok else "FAILED", time.monotonic() - start)
        if not ok:
            failed.append(step)
            if step == "build":
                break  # nothing after it can run
    log.info("gpu_check: %s", f"FAILED: {', '.join(failed)}" if failed else "all steps passed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dir", default=str(REPO / ".gpu"), help="where carry/, work/ and model parts live "
                        "(default: .gpu in the checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="gather what the offline machine needs into DIR/carry (needs the network)")
    p.add_argument("--model", default=None, help="also split this registry model (or GGUF path) into DIR/model-part<i>/")
    p.add_argument("--part-mb", type=float, default=48.0, help="largest model part, MB (default 48)")
    p.add_argument("--quick", action="store_true", help="small model shapes, no real models needed (for CI)")
    p.add_argument("--no-cpu-reference", action="store_true", help="do not include this CPU's cost curves")
    p.set_defaults(handler=_cmd_pack)
    r = sub.add_parser("run", help="build, test and measure (offline)")
    r.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, in order (default {','.join(STEPS)})")
    r.add_argument("--cpu", action="store_true", help="build and run on the CPU backend instead of CUDA")
    r.add_argument("--quick", action="store_true", help="two test files and small shapes (for CI)")
    r.add_argument("--cuda-arch", default="native", help="CMAKE_CUDA_ARCHITECTURES (default native: the GPU here)")
    r.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)")
    r.add_argument("--out", default=None, help="results directory (default $OUT, else DIR/out)")
    r.set_defaults(handler=_cmd_run)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout)
    logging.getLogger("pyspec.llama").setLevel(logging.WARNING)  # pack loads models: not their load logs
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
