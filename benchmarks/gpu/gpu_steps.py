"""`gpu_check.py run`'s steps: build, test, shapes, plan, real (see gpu_check.py).

Nothing here imports pyspec at module level: on the GPU machine pyspec exists only after the
build step, in its own site directory, and every later step runs in a subprocess that has it on
its path (the same libllama the build made, never another one on the machine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from shape_model import ModelShape

log = logging.getLogger("gpu_check")

STEPS = ("build", "test", "shapes", "plan", "real")
# The engine's tests on tiny models that exercise decoding on the backend: greedy identity,
# chi-square sampling, trees and beams, pools, lookup, auto, draft reload, logprobs, prefix cache,
# the rows' argmax on the backend (the default where the output layer is on the GPU).
TEST_FILES = ("test_greedy.py", "test_sampling.py", "test_tree.py", "test_pool.py", "test_lookup.py",
              "test_auto.py", "test_draft_reload.py", "test_tiny_model.py", "test_logprobs.py",
              "test_prefix_cache.py", "test_lifecycle.py", "test_hidden.py", "test_backend_argmax.py")
QUICK_TEST_FILES = ("test_greedy.py", "test_tiny_model.py")
# --quick's stand-in for the real shapes: a small qwen2 model (seconds to write and time on a CPU).
QUICK_SHAPE = ModelShape(arch="qwen2", n_vocab=4096, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512,
                         tied_output=False)
ALL_LAYERS = 999  # more layers than any model here has: llama.cpp offloads them all
REAL_METHODS = "none,lookup,auto"  # the methods that need no draft model
REAL_MAX_TOKENS = 128


@dataclass(frozen=True)
class Layout:
    """Where things live under one directory (.gpu in the checkout by default)."""

    root: Path

    @property
    def carry(self) -> Path:
        return self.root / "carry"

    @property
    def llama_tar(self) -> Path:
        return self.carry / "llama.cpp.tar.xz"

    @property
    def wheels(self) -> Path:
        return self.carry / "wheels"

    @property
    def manifest(self) -> Path:
        return self.carry / "manifest.json"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def part_dir(self, i: int) -> Path:
        return self.root / f"model-part{i}"

    def part_dirs(self) -> list[Path]:
        return sorted(p for p in self.root.glob("model-part*") if p.is_dir())


@dataclass(frozen=True)
class RunContext:
    layout: Layout
    out: Path
    cuda: bool
    quick: bool
    jobs: int
    cuda_arch: str
    repo: Path

    @property
    def backend(self) -> str:
        return "cuda" if self.cuda else "cpu"

    @property
    def prefix(self) -> Path:
        return self.layout.work / f"llama-{self.backend}"

    @property
    def site(self) -> Path:
        return self.layout.work / f"site-{self.backend}"

    @property
    def tools_site(self) -> Path:
        return self.layout.work / "tools-site"

    @property
    def first_site(self) -> Path:
        """First on the path: a sitecustomize that keeps an editable pyspec install of the
        running environment (a developer's venv) from shadowing the built one."""
        return self.layout.work / "built-first"

    def manifest(self) -> dict:
        if not self.layout.manifest.is_file():
            raise FileNotFoundError(f"{self.layout.manifest} is missing: run `gpu_check.py pack` first (with the network)")
        return json.loads(self.layout.manifest.read_text(encoding="utf-8"))

    def env(self) -> dict[str, str]:
        """The environment of every step's subprocess: the built pyspec first on the path, caches
        under work/, offload of every layer on CUDA."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.first_site), str(self.site), str(self.tools_site)] +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYSPEC_CACHE"] = str(self.layout.work / "cache")
        env["PYSPEC_CALIBRATION_DIR"] = str(self.layout.work / f"calibration-{self.backend}")
        env["PYTHONUNBUFFERED"] = "1"
        if self.cuda:
            env["PYSPEC_N_GPU_LAYERS"] = str(ALL_LAYERS)
        else:
            env.pop("PYSPEC_N_GPU_LAYERS", None)
        return env


def _run(cmd: list[str], what: str, *, log_file: Path, cwd: Path | None = None, env: dict[str, str] | None = None,
         tail: int = 30) -> bool:
    """Runs cmd with its output appended to log_file; logs the tail on failure. True on success."""
    shown = " ".join("<code>" if "\n" in c else c for c in cmd)
    log.info("%s: %s", what, shown)
    with open(log_file, "a", encoding="utf-8") as out:
        out.write(f"\n$ {shown}\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env).returncode
    if code != 0:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-tail:]
        log.error("%s failed (exit %d); end of %s:\n%s", what, code, log_file, "\n".join(lines))
    return code == 0


def _python(ctx: RunContext, code: str, what: str, log_name: str) -> bool:
    return _run([sys.executable, "-c", textwrap.dedent(code)], what, log_file=ctx.out / log_name,
                cwd=ctx.layout.work, env=ctx.env())


# -- build ---------------------------------------------------------------------------------------


def _cmake_options(ctx: RunContext) -> list[str]:
    # $ORIGIN: the installed libraries find each other in their own directory (libggml loads
    # libggml-cpu / libggml-cuda by name), wherever they are copied.
    opts = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_INSTALL_LIBDIR=lib",
            "-DCMAKE_INSTALL_RPATH=$ORIGIN",
            f"-DCMAKE_INSTALL_PREFIX={ctx.prefix}", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_COMMON=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_MTMD=OFF"]
    if ctx.cuda:
        # GGML_CUDA_FA=OFF compiles the FlashAttention kernels' bodies out (dozens of template
        # instances); the engine runs with flash_attn off, its default.
        opts += ["-DGGML_CUDA=ON", "-DGGML_CUDA_FA=OFF", "-DGGML_CUDA_NCCL=OFF", f"-DCMAKE_CUDA_ARCHITECTURES={ctx.cuda_arch}"]
    if shutil.which("ninja"):
        opts += ["-G", "Ninja"]
    return opts


def _links_shared_libstdcxx(cxx: str, scratch: Path) -> bool:
    """Whether cxx links a shared library against libstdc++.so (its dynamic section needs it)."""
    scratch.mkdir(parents=True, exist_ok=True)
    source, lib = scratch / "probe.cpp", scratch / "libprobe.so"
    source.write_text("int probe() { throw 1; }\n", encoding="utf-8")
    try:
        subprocess.run([cxx, "-shared", "-fPIC", str(source), "-o", str(lib)], check=True, capture_output=True)
        needed = subprocess.run(["readelf", "-d", str(lib)], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    return "libstdc++" in needed


def compiler_env(scratch: Path) -> dict[str, str]:
    """CXX, CC and nvcc's host compiler for the builds: the environment's compiler ($CXX, else c++,
    as CMake takes it), else g++, else /usr/bin/g++, the first that links the C++ runtime as a
    shared library. A compiler that links libstdc++ statically into
    each shared library (the CUDA image's /opt/gcc wrapper, named by its $CXX, does) gives libllama,
    libggml-cuda and pyspec's _core each a private copy of it with its symbols exported; the
    dynamic linker then binds some of libllama's locale and stream symbols to libggml-cuda's copy,
    and llama.cpp's tokenizer crashed compiling a std::regex under pytest with its plugins and in
    processes that had imported torch or jax (a plain python3 ran). Empty when the environment's
    own compiler already links it shared, or when none found does."""
    default = os.environ.get("CXX") or shutil.which("c++")  # what CMake would take
    if default and _links_shared_libstdcxx(default, scratch):
        return {}
    for cxx in (shutil.which("g++"), "/usr/bin/g++"):
        if cxx and cxx != default and _links_shared_libstdcxx(cxx, scratch):
            cc = str(Path(cxx).with_name(Path(cxx).name.replace("g++", "gcc")))
            log.info("C++ compiler: %s (the default, %s, links libstdc++ statically into shared libraries)",
                     cxx, default)
            return {"CXX": cxx, "CC": cc, "CUDAHOSTCXX": cxx}
    log.warning("no C++ compiler here links libstdc++ as a shared library: libllama and pyspec each carry "
                "their own copy, which crashed llama.cpp's tokenizer under pytest on CUDA")
    return {}


def _build_llama(ctx: RunContext, compilers: dict[str, str]) -> bool:
    done = ctx.prefix / ".built"
    if done.is_file():
        log.info("libllama (%s) already built in %s", ctx.backend, ctx.prefix)
        return True
    src = ctx.layout.work / "src"
    if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        with tarfile.open(ctx.layout.llama_tar) as tar:
            tar.extractall(src, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(src)
    build = ctx.layout.work / f"build-{ctx.backend}"
    log_file = ctx.out / f"build-{ctx.backend}.log"
    env = {**os.environ, **compilers}
    if not _run(["cmake", "-S", str(src / "llama.cpp"), "-B", str(build), *_cmake_options(ctx)],
                "configuring llama.cpp", log_file=log_file, env=env):
        return False
    if not _run(["cmake", "--build", str(build), "--config", "Release", "-j", str(ctx.jobs), "--target", "llama"],
                f"building libllama ({ctx.backend})", log_file=log_file, env=env):
        return False
    if not _run(["cmake", "--install", str(build), "--config", "Release"], "installing libllama", log_file=log_file):
        return False
    done.write_text("ok\n", encoding="utf-8")
    return True


def _install_wheels(ctx: RunContext) -> bool:
    if (ctx.tools_site / ".installed").is_file():
        return True
    wheels = sorted(str(w) for w in ctx.layout.wheels.glob("*.whl"))
    shutil.rmtree(ctx.tools_site, ignore_errors=True)
    ok = _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--target", str(ctx.tools_site), *wheels], "installing the carried wheels",
              log_file=ctx.out / "build-pyspec.log")
    if ok:
        (ctx.tools_site / ".installed").write_text("ok\n", encoding="utf-8")
    return ok


def _build_pyspec(ctx: RunContext, compilers: dict[str, str]) -> bool:
    """pyspec from this checkout, against the libllama just built, into ctx.site; that libllama
    goes where _core's RPATH looks ($ORIGIN/../llama_cpp/lib)."""
    shutil.rmtree(ctx.site, ignore_errors=True)
    env = {**ctx.env(), **compilers}
    env["CMAKE_PREFIX_PATH"] = str(ctx.prefix)
    env["PYTHONPATH"] = str(ctx.tools_site)
    build_dir = ctx.layout.work / f"pyspec-build-{ctx.backend}"
    if not _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
                 "--no-compile", "--target", str(ctx.site), f"--config-settings=build-dir={build_dir}",
                 str(ctx.repo)], f"building pyspec against libllama ({ctx.backend})",
                log_file=ctx.out / "build-pyspec.log", env=env):
        return False
    lib_dir = ctx.site / "llama_cpp" / "lib"
    lib_dir.mkdir(parents=True)
    libs = [p for p in (ctx.prefix / "lib").iterdir() if ".so" in p.name]
    for lib in libs:
        shutil.copy2(lib, lib_dir / lib.name, follow_symlinks=False)
    log.info("libllama and ggml libraries for pyspec: %s", ", ".join(sorted(p.name for p in libs)))
    return True


# An editable install's import hook (scikit-build-core's redirecting finder, put on sys.meta_path
# by a .pth file) would answer `import pyspec` before PYTHONPATH is searched.
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_skbc_pyspec")]
"""


def build_step(ctx: RunContext) -> bool:
    ctx.layout.work.mkdir(parents=True, exist_ok=True)
    ctx.first_site.mkdir(exist_ok=True)
    (ctx.first_site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    compilers = compiler_env(ctx.layout.work / "compiler-probe")
    return (_install_wheels(ctx) and _build_llama(ctx, compilers) and _build_pyspec(ctx, compilers)
            and _python(ctx, f"""
                import pyspec, sys
                from pathlib import Path
                from pyspec import _core
                print("pyspec from", pyspec.__file__, "with", _core.__file__)
                if Path({str(ctx.site)!r}) not in Path(_core.__file__).parents:
                    sys.exit("the pyspec imported is not the one just built")
            """, "importing the built pyspec", "build-pyspec.log"))


# -- test ----------------------------------------------------------------------------------------


OFFLOAD_CHECK = """
    import logging, re, sys, tempfile
    from pathlib import Path
    from pyspec import Engine
    from pyspec._models.tiny import build_tiny_model

    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage().strip())
    logging.getLogger("pyspec.llama").addHandler(Keep())
    logging.getLogger("pyspec.llama").setLevel(logging.DEBUG)
    with tempfile.TemporaryDirectory() as d:
        model = build_tiny_model(Path(d) / "tiny.gguf")
        with Engine(model, n_ctx=256) as engine:
            info = engine._core.system_info()
            text = engine.generate("def add(a, b):", max_tokens=8).text
    print("system info:", info)
    where = [l for l in lines if "offload" in l or "buffer size" in l]
    print("\\n".join(where))
    print("generated:", repr(text))
    counts = [tuple(map(int, m.groups())) for l in where for m in [re.search(r"offloaded (\\d+)/(\\d+) layers", l)] if m]
    all_on_gpu = bool(counts) and all(n == total > 0 for n, total in counts) and any("CUDA" in l for l in where)
    none_on_gpu = all(n == 0 for n, _ in counts) and not any("CUDA" in l for l in where)
    if (sys.argv[1] == "cuda" and not all_on_gpu) or (sys.argv[1] == "cpu" and not none_on_gpu):
        sys.exit(f"expected every layer {'on' if sys.argv[1] == 'cuda' else 'off'} the GPU; llama.cpp says: {where}")
"""


def test_step(ctx: RunContext) -> bool:
    files = QUICK_TEST_FILES if ctx.quick else TEST_FILES
    tests = ctx.repo / "tests"
    log_file = ctx.out / "tests.log"
    offload_ok = _run([sys.executable, "-c", textwrap.dedent(OFFLOAD_CHECK), ctx.backend],
                      "checking where llama.cpp puts the layers", log_file=log_file, cwd=ctx.layout.work, env=ctx.env())
    # From work/ (not the checkout), so `import pyspec` finds the built one, never the source tree.
    tests_ok = _run([sys.executable, "-m", "pytest", "-q", "-m", "not model", "-p", "no:cacheprovider",
                     "--rootdir", str(ctx.repo), "-c", str(ctx.repo / "pyproject.toml"),
                     *[str(tests / f) for f in files]],
                    f"the engine's tests ({ctx.backend}, PYSPEC_N_GPU_LAYERS={ctx.env().get('PYSPEC_N_GPU_LAYERS', 'unset')})",
                    log_file=log_file, cwd=ctx.layout.work, env=ctx.env())
    summary = [line for line in log_file.read_text(encoding="utf-8").splitlines()
               if " passed" in line or " failed" in line or "error" in line.lower()][-3:]
    log.info("tests: %s", " | ".join(summary))
    return offload_ok and tests_ok


# -- shapes and plans ----------------------------------------------------------------------------


def _shape_path(ctx: RunContext, role: str, shape: dict) -> Path:
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    return ctx.layout.work / "models" / f"{role}-shape-{digest}.gguf"


def shapes_step(ctx: RunContext) -> bool:
    shapes = ctx.manifest()["shapes"]
    code = """
        import json, sys, time
        sys.path.insert(0, sys.argv[1])
        from shape_model import ModelShape, write_shape_model
        shape = ModelShape.from_json(json.load(open(sys.argv[2])))
        start = time.monotonic()
        write_shape_model(shape, sys.argv[3])
        print(f"{sys.argv[3]}: {shape.describe()}, written in {time.monotonic() - start:.0f} s")
    """
    ok = True
    for role in ("target", "draft"):
        path = _shape_path(ctx, role, shapes[role])
        if path.is_file():
            log.info("%s shape model already written: %s", role, path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        shape_file = path.with_suffix(".json")
        shape_file.write_text(json.dumps(shapes[role]), encoding="utf-8")
        ok = _run([sys.executable, "-c", textwrap.dedent(code), str(Path(__file__).parent), str(shape_file),
                   str(path)], f"writing the {role}'s shape model", log_file=ctx.out / "shapes.log",
                  cwd=ctx.layout.work, env=ctx.env()) and ok
    return ok


PLAN_CODE = """
    import json, sys
    from pyspec import Engine, _core
    from pyspec.calibration import CostCurve

    target, draft, n_gpu_layers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with Engine(target, draft=draft, n_gpu_layers=n_gpu_layers) as engine:
        curves = engine.calibrate(force=True, progress=False)
        info = engine._core.system_info()
    result = {"system_info": info, "n_gpu_layers": n_gpu_layers,
              "curves": {k: {"n_tokens": list(c.n_tokens), "ms": list(c.ms)} for k, c in curves.items()}}
    json.dump(result, open(out, "w"), indent=1)
    for name, c in curves.items():
        print(name, " ".join(f"k{k}:{t:.2f}" for k, t in zip(c.n_tokens, c.ms)))
"""


def plan_step(ctx: RunContext) -> bool:
    manifest = ctx.manifest()
    paths = {role: _shape_path(ctx, role, manifest["shapes"][role]) for role in ("target", "draft")}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        log.error("plan: shape models missing (run the shapes step): %s", ", ".join(missing))
        return False
    curves_file = ctx.out / f"curves-{ctx.backend}.json"
    if not _run([sys.executable, "-c", textwrap.dedent(PLAN_CODE), str(paths["target"]), str(paths["draft"]),
                 str(ALL_LAYERS if ctx.cuda else 0), str(curves_file)], "calibrating the shape models",
                log_file=ctx.out / "plan.log", cwd=ctx.layout.work, env=ctx.env()):
        return False
    table_code = """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from gpu_report import plan_report
        print(plan_report(json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]))
    """
    report = ctx.out / "plan.md"
    with open(report, "w", encoding="utf-8") as out:
        code = subprocess.run([sys.executable, "-c", textwrap.dedent(table_code), str(Path(__file__).parent),
                               str(curves_file), str(ctx.layout.manifest), ctx.backend],
                              stdout=out, stderr=subprocess.PIPE, text=True, cwd=ctx.layout.work, env=ctx.env())
    if code.returncode != 0:
        log.error("plan report failed: %s", code.stderr[-3000:])
        return False
    log.info("plan:\n%s", report.read_text(encoding="utf-8"))
    return True


# -- real model ----------------------------------------------------------------------------------


def _assemble_model(ctx: RunContext, model: dict) -> Path | None:
    """The real model from its carried parts (checked part by part and whole), or None when a
    part is not on this machine."""
    dest = ctx.layout.work / "models" / model["file"]
    if dest.is_file() and dest.stat().st_size == model["size"]:
        return dest
    part_files = [ctx.layout.root / p["dir"] / p["file"] for p in model["parts"]]
    absent = [str(p) for p in part_files if not p.is_file()]
    if absent:
        log.warning("real: model parts not on this machine: %s", ", ".join(absent))
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    partial = dest.with_name(dest.name + ".partial")
    with open(partial, "wb") as out:
        for spec, path in zip(model["parts"], part_files):
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != spec["sha256"]:
                raise ValueError(f"{path}: sha256 differs from the packed part's")
            whole.update(data)
            out.write(data)
    if whole.hexdigest() != model["sha256"]:
        partial.unlink()
        raise ValueError(f"{dest.name}: the assembled file's sha256 differs from the packed model's")
    partial.replace(dest)
    return dest


REAL_CODE = """
    import json, sys
    from pyspec.bench import run_bench
    from pyspec.bench.report import format_markdown

    model, prompts_file, methods, max_tokens, n_gpu_layers, out = sys.argv[1:7]
    prompts = [p["messages"] for p in json.load(open(prompts_file))]
    report = run_bench(model, None, prompts, max_tokens=int(max_tokens), methods=methods,
                       n_gpu_layers=int(n_gpu_layers), progress=False)
    open(out + ".md", "w").write(format_markdown(report) + "\\n")
    json.dump(report.to_dict(), open(out + ".json", "w"), indent=1)
    print(format_markdown(report))
"""


# Real steps against the calibrated curve, and the rows' argmax on the host against the backend:
# every greedy step of lookup and auto on the real prompts, by size, both ways, alternating.
STEP_COST_CODE = """
    import json, statistics, sys
    import pyspec

    model, prompts_file, max_tokens, n_gpu_layers, out = sys.argv[1:6]
    prompts = [p["messages"] for p in json.load(open(prompts_file))]
    buckets = [(1, 1), (2, 4), (5, 8), (9, 16), (17, 64)]
    rows = {}
    with pyspec.Engine(model, n_gpu_layers=int(n_gpu_layers)) as engine:
        curve = engine.calibrate()["target"]
        for path in ("host", "backend"):
            steps = {b: [] for b in buckets}
            same = []
            for prompt in prompts:
                for method in ("none", "lookup", "auto"):
                    engine.generate(prompt, max_tokens=8, method=method)  # warm this shape family
                    result = engine.generate(prompt, max_tokens=int(max_tokens), method=method,
                                             backend_argmax=path == "backend")
                    for size, ms in zip(result.step_sizes.tolist(), result.step_ms.tolist()):
                        for b in buckets:
                            if b[0] <= size <= b[1]:
                                steps[b].append((size, ms))
            one = statistics.median(ms for _, ms in steps[(1, 1)]) if steps[(1, 1)] else float("nan")
            for b, seen in steps.items():
                if not seen:
                    continue
                median_ms = statistics.median(ms for _, ms in seen)
                median_size = int(statistics.median(size for size, _ in seen))
                rows.setdefault(f"{b[0]}-{b[1]}", {})[path] = {
                    "steps": len(seen), "median_size": median_size, "median_ms": round(median_ms, 3),
                    "vs_one_token_step": round(median_ms / one, 3),
                    "calibrated_vs_one_token": round(curve.at(median_size) / curve.at(1), 3)}
    report = {"calibrated_ms": dict(zip(curve.n_tokens, curve.ms)), "by_size": rows}
    json.dump(report, open(out + ".json", "w"), indent=1)
    lines = ["| tokens in the step | argmax | steps | median ms | vs a one-token step | calibration says |",
             "|---|---|---|---|---|---|"]
    for size, by_path in rows.items():
        for path, r in by_path.items():
            lines.append(f"| {size} | {path} | {r['steps']} | {r['median_ms']} | {r['vs_one_token_step']} | "
                         f"{r['calibrated_vs_one_token']} |")
    open(out + ".md", "w").write("\\n".join(lines) + "\\n")
    print("\\n".join(lines))
"""


def real_step(ctx: RunContext) -> bool:
    manifest = ctx.manifest()
    model = manifest.get("model")
    if not model:
        log.info("real: no model was packed (pack --model NAME); skipped")
        return True
    path = _assemble_model(ctx, model)
    if path is None:
        log.info("real: skipped")
        return True
    prompts = ctx.layout.work / "prompts.json"
    prompts.write_text(json.dumps(manifest["prompts"]), encoding="utf-8")
    n_gpu_layers = str(ALL_LAYERS if ctx.cuda else 0)
    ok = _run([sys.executable, "-c", textwrap.dedent(REAL_CODE), str(path), str(prompts), REAL_METHODS,
               str(REAL_MAX_TOKENS), n_gpu_layers, str(ctx.out / f"real-{ctx.backend}")],
              f"tokens/s of {REAL_METHODS} on {model['name']}", log_file=ctx.out / "real.log",
              cwd=ctx.layout.work, env=ctx.env(), tail=60)
    return _run([sys.executable, "-c", textwrap.dedent(STEP_COST_CODE), str(path), str(prompts), str(REAL_MAX_TOKENS),
                 n_gpu_layers, str(ctx.out / f"steps-{ctx.backend}")],
                f"real steps against calibration, argmax on the host and on the backend, on {model['name']}",
                log_file=ctx.out / "steps.log", cwd=ctx.layout.work, env=ctx.env(), tail=30) and ok
