"""Fuzzing every input a user or a file brings to the engine, on the tiny models.

Kinds of input: GenerationConfig values, prompts (text and token ids), chat messages, phrase pool
files, GGUF files (for a new engine and for a draft reload), and the Engine constructor's
settings. Every case must either succeed or raise a typed error (a pyspec.SpecError subclass,
TypeError for a value of the wrong type, FileNotFoundError), and the engine must still produce
its reference output afterwards (a failed draft reload keeps the old draft serving, a failed
pool load keeps the old pool). Anything else is a finding.

Cases run in a child process (`python tests/fuzz_cases.py ...`), so that a crash ends one case,
not the run: the parent (`run_fuzz`) records it and restarts the child after it. Case i of a kind
is generated from (seed, kind, i) alone, so a restart, or a rerun, reproduces it.
Used by tests/test_fuzz.py (short runs) and scripts/fuzz.py (long runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("config", "prompt", "messages", "pool_file", "gguf", "gguf_draft", "engine_settings")

# ---- case generators (pure: a random.Random in, a case out) ---------------------------------------

INT_FIELDS = ["max_tokens", "top_k", "n_draft", "auto_max_depth", "auto_max_nodes", "auto_max_gamma", "auto_head_tree_nodes",
              "auto_corpus_max_depth", "auto_corpus_min_total", "lookup_ngram_max", "lookup_ngram_min",
              "tree_nodes", "tree_depth", "tree_branching", "tree_expand", "beams", "beam_length", "pool_branches",
              "pool_phrase_len", "pool_max_nodes", "trace_top_k", "seed", "logprobs"]
FLOAT_FIELDS = ["temperature", "top_p", "min_p", "typical_epsilon", "typical_delta"]
BOOL_FIELDS = ["auto_draft_model", "auto_head", "auto_corpus", "auto_adapt_costs", "lookup_unit_ends", "lookup_substitutions", "lookup_resync", "lookup_loose_substitutions", "lookup_fences", "pool",
               "harvest_prompt", "harvest_generated", "harvest_verification", "return_logits", "backend_argmax"]
STR_FIELDS = ["method", "draft", "acceptance"]
METHODS = ["auto", "none", "chain", "tree", "beam", "lookup", "ouroboros"]

HOSTILE_INTS: list[Any] = [-(2**63), -(2**31) - 1, -(2**31), -1000, -1, 0, 1, 2, 3, 7, 63, 64, 65, 255, 256, 1000,
                           2**31 - 1, 2**31, 2**63, 2**64, 10**30, 1.5, float("nan"), "3", None, True, np.int64(4),
                           np.int32(-2), np.uint64(2**63), [1]]
HOSTILE_FLOATS: list[Any] = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-45, 1e-10, 0.5, 0.999999, 1.0,
                             1.0000001, 2.0, 1e30, 1e300, -1.0, "0.5", None, True, np.float32(0.7), np.float64(1e-3),
                             complex(1, 1), 10**400]
HOSTILE_STRS: list[Any] = ["", "\x00", "x" * 10000, "\ud800", "none", "chain ", "CHAIN", "tree", "exact", "typical",
                           "\u00e9", 3, None, b"chain", ["chain"]]
HOSTILE_STOPS: list[Any] = [None, "", [""], ["\x00"], "a", ["a", ""], [1], "x" * 1000, ["e"] * 1000, b"stop",
                            ("a", "b"), ["\ud800"], ["\u4e2d"], 5, [None], {"a": 1}]


def config_case(rng: random.Random) -> dict[str, Any]:
    """Keyword options for generate(): a random method plus 1-3 hostile field values."""
    options: dict[str, Any] = {"method": rng.choice(METHODS), "max_tokens": rng.choice([0, 1, 8, 24])}
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.45:
            options[rng.choice(INT_FIELDS)] = rng.choice(HOSTILE_INTS)
        elif kind < 0.7:
            options[rng.choice(FLOAT_FIELDS)] = rng.choice(HOSTILE_FLOATS)
        elif kind < 0.8:
            options[rng.choice(BOOL_FIELDS)] = rng.choice([True, False, 0, 1, None, "yes", np.bool_(True)])
        elif kind < 0.9:
            options[rng.choice(STR_FIELDS)] = rng.choice(HOSTILE_STRS)
        else:
            options["stop"] = rng.choice(HOSTILE_STOPS)
    if isinstance(options.get("max_tokens"), int) and options["max_tokens"] > 300:
        options["max_tokens"] = 300  # a huge budget is checked by value; the context ends it anyway
    return options


def random_text(rng: random.Random, n: int) -> str:
    pools = ["abc def\n", "\u00e9\u00e8\u4e2d\u6587\U0001f600", "<|im_start|><|im_end|><|endoftext|>", "\x00\x01\x7f",
             "\ud800\udfff", "    def f(x):\n        return x\n"]
    alphabet = rng.choice(pools)
    return "".join(rng.choice(alphabet) for _ in range(n))


def prompt_case(rng: random.Random, n_vocab: int) -> Any:
    """A prompt as generate() accepts it: text, token ids, or odd objects."""
    kind = rng.randrange(12)
    if kind == 0:
        return random_text(rng, rng.choice([0, 1, 5, 50, 400]))
    if kind == 1:
        return random_text(rng, 5000)  # longer than the context
    if kind == 2:
        return [rng.randrange(n_vocab) for _ in range(rng.choice([1, 2, 30, 255, 256, 300]))]
    if kind == 3:
        bad = rng.choice([-1, n_vocab, n_vocab + 1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63, 2**70])
        tokens = [rng.randrange(n_vocab) for _ in range(5)]
        tokens.insert(rng.randrange(6), bad)
        return tokens
    if kind == 4:
        return []
    if kind == 5:
        dtype = rng.choice([np.int64, np.int32, np.uint8])
        return np.array([rng.randrange(min(n_vocab, np.iinfo(dtype).max)) for _ in range(10)], dtype=dtype)
    if kind == 6:
        return np.array([1.5, 2.5])
    if kind == 7:
        return [1, 2.0, 3]
    if kind == 8:
        return rng.choice([None, 42, b"bytes", bytearray(b"x"), {"role": "user", "content": "hi"}, 3.5, object()])
    if kind == 9:
        return [True, False, 1]
    if kind == 10:
        return [[1, 2], [3]]
    return "".join(chr(rng.randrange(0x10FFFF)) for _ in range(rng.randint(1, 40)))


def messages_case(rng: random.Random) -> Any:
    """Chat messages of every shape."""
    roles = ["user", "assistant", "system", "tool", "", "robot", "<|im_start|>", 1, None]
    contents: list[Any] = ["hi", "", "x" * 3000, "\ud800", "<|im_end|>", None, 5, ["part"],
                           [{"type": "text", "text": "hi"}], {"a": 1}, b"bytes", "\u4e2d\u6587\x00",
                           # OpenAI content parts: text parts are read, every other shape is refused
                           [{"type": "text", "text": "a"}, {"type": "text", "text": "\u00e9"}], [],
                           [{"type": "image_url", "image_url": {"url": "x"}}], [{"type": "text"}],
                           [{"type": "text", "text": 5}], [{"type": "text", "text": "\ud800"}], [{"type": 3}],
                           ({"type": "text", "text": "t"},), [None], [{"text": "no type"}]]
    kind = rng.randrange(8)
    if kind == 0:
        return []
    if kind == 1:
        return [{}]
    if kind == 2:
        return [{"role": "user"}]
    if kind == 3:
        return [{"content": "hi"}]
    if kind == 4:
        return [{"role": "user", "content": "hi"}, rng.choice([1, "text", None, ["x"]])]
    if kind == 5:
        return tuple({"role": rng.choice(roles), "content": rng.choice(contents)} for _ in range(rng.randint(1, 3)))
    if kind == 6:
        return [{"role": "user", "content": "hi", "name": "x", "extra": [1, 2]} for _ in range(rng.choice([1, 60]))]
    return [{"role": rng.choice(roles), "content": rng.choice(contents)} for _ in range(rng.randint(1, 4))]


def mutate_bytes(data: bytes, rng: random.Random, header_bytes: int) -> bytes:
    """A random damage, weighted towards the first header_bytes (where parsers decide things)."""
    b = bytearray(data)
    kind = rng.randrange(7)
    def where() -> int:
        return rng.randrange(min(len(b), header_bytes)) if rng.random() < 0.8 else rng.randrange(len(b))
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            b[where()] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.choice([rng.randrange(header_bytes), rng.randrange(len(b))]):]
    elif kind == 2:
        for _ in range(rng.randint(1, 8)):
            b[where()] = rng.randrange(256)
    elif kind == 3:  # a 64-bit count or length made huge, small or negative
        at = where()
        value = rng.choice([0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, rng.randrange(2**16)])
        b[at:at + 8] = value.to_bytes(8, "little")
    elif kind == 4:
        at = where()
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 5:
        at = where()
        del b[at:at + rng.randint(1, 64)]
    else:
        b[where():where() + 4] = rng.randrange(2**32).to_bytes(4, "little")
    return bytes(b)


# ---- running cases -----------------------------------------------------------------------------

def accepted_error(exc: BaseException) -> bool:
    import pyspec

    return isinstance(exc, (pyspec.SpecError, TypeError, FileNotFoundError))


@dataclass
class Fixture:
    """The engine a child fuzzes, and what it must still produce after every case."""

    target: str
    draft: str
    workdir: Path
    engine: Any = None
    reference: list[int] = field(default_factory=list)
    chain_reference: list[int] = field(default_factory=list)
    pool_file: bytes = b""

    def open(self) -> None:
        import pyspec

        self.engine = pyspec.Engine(self.target, draft=self.draft, n_ctx=256, n_threads=1, seed=1)
        self.reference = self.engine.generate("hello world", max_tokens=6, method="none").tokens
        self.chain_reference = self.engine.generate("hello world", max_tokens=6, method="chain").tokens
        self.engine.generate("the cat sat on the mat, the cat sat", max_tokens=20, method="lookup")
        pool_path = self.workdir / "seed.pool"
        self.engine.save_pool(pool_path)
        self.pool_file = pool_path.read_bytes()

    def still_serving(self) -> str | None:
        """None when the engine still gives its reference outputs, else what differs."""
        e = self.engine
        if e.generate("hello world", max_tokens=6, method="none").tokens != self.reference:
            return "plain decoding changed"
        if e.generate("hello world", max_tokens=6, method="chain").tokens != self.chain_reference:
            return "chain decoding with the draft changed"
        return None


def run_case(fx: Fixture, kind: str, rng: random.Random) -> tuple[str, str]:
    """Runs one case: ("ok" | "typed" | "wrong", detail)."""
    import pyspec

    e = fx.engine
    detail = "(case not built)"
    try:
        if kind == "config":
            options = config_case(rng)
            detail = repr(options)[:200]
            e.generate("hello world", **options)
        elif kind == "prompt":
            prompt = prompt_case(rng, e.n_vocab)
            detail = repr(prompt)[:200]
            e.generate(prompt, max_tokens=4, method=rng.choice(METHODS))
        elif kind == "messages":
            messages = messages_case(rng)
            detail = repr(messages)[:200]
            e.generate(messages, max_tokens=4, method=rng.choice(["none", "lookup"]))
        elif kind == "pool_file":
            data = mutate_bytes(fx.pool_file, rng, 36 + 64)
            detail = f"{len(data)} bytes"
            path = fx.workdir / "fuzz.pool"
            path.write_bytes(data)
            before = e.pool_stats()["size"]
            try:
                e.load_pool(path)
            except pyspec.SpecError:
                if e.pool_stats()["size"] != before:
                    return "wrong", "a failed pool load changed the pool"
                raise
            e.generate("the cat sat", max_tokens=6, method="lookup")
            e.load_pool(fx.workdir / "seed.pool")
        elif kind in ("gguf", "gguf_draft"):
            data = mutate_bytes(Path(fx.target).read_bytes(), rng, 8192)
            detail = f"{len(data)} bytes"
            path = fx.workdir / "fuzz.gguf"
            path.write_bytes(data)
            if kind == "gguf":
                with pyspec.Engine(str(path), n_ctx=128, n_threads=1) as other:
                    other.generate("hello", max_tokens=4, method="none")
            else:
                version = e.draft_version
                try:
                    e.reload_draft(path)
                except BaseException:
                    if e.draft_version != version:
                        return "wrong", "a failed draft reload changed the draft version"
                    raise
                e.generate("hello", max_tokens=4, method="chain")
                e.reload_draft(fx.draft)
        elif kind == "engine_settings":
            settings = {name: rng.choice(values) for name, values in {
                "n_ctx": [0, 1, 2, 8, 64, 256, -1, 2**31 - 1, 2**40, 1.5, None],
                "n_batch": [0, 1, 2, 63, 64, 512, -5, 2**31 - 1, 2**40, "8"],
                "n_threads": [None, 0, 1, 2, 64, 512, 513, -1, 2**31, 1.0],
                "n_gpu_layers": [0, 1, -1, 99, 2**31 - 1, 2**31],
                "seed": [0, 1, -1, 2**64 - 1, 2**64, None],
                "flash_attn": [False, True, None, "auto", "on", "off", "fast", 1],
            }.items() if rng.random() < 0.5}
            detail = repr(settings)
            with pyspec.Engine(fx.target, draft=fx.draft, **settings) as other:
                other.generate("hello", max_tokens=4, method=rng.choice(["none", "chain", "auto"]))
        else:
            raise ValueError(f"unknown fuzz kind {kind!r}")
        outcome = ("ok", detail)
    except BaseException as exc:  # noqa: BLE001 - classifying every outcome is the point
        if isinstance(exc, KeyboardInterrupt):
            raise
        if not accepted_error(exc):
            return "wrong", f"{detail}: untyped {type(exc).__name__}: {exc}"[:400]
        if "engine is closed" in str(exc) and kind not in ("gguf", "engine_settings"):
            return "wrong", f"{detail}: the engine was closed"
        outcome = ("typed", f"{type(exc).__name__}")
    broken = fx.still_serving()
    if broken:
        return "wrong", f"{outcome[1]}: afterwards {broken}"
    return outcome


def child_main(argv: list[str]) -> int:
    """Runs cases start..stop of a kind, printing one JSON line per case before and after it."""
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int, required=True)
    args = p.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="pyspec-fuzz-") as tmp:
        fx = Fixture(args.target, args.draft, Path(tmp))
        fx.open()
        for i in range(args.start, args.stop):
            print(json.dumps({"start": i}), flush=True)
            rng = random.Random(f"{args.seed}:{args.kind}:{i}")
            outcome, detail = run_case(fx, args.kind, rng)
            print(json.dumps({"case": i, "outcome": outcome, "detail": detail}), flush=True)
    return 0


@dataclass
class FuzzReport:
    kind: str
    n_cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # typed error class -> count
    wrong: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.kind}: {self.n_cases} cases, {self.outcomes['ok']} ok, {self.outcomes['typed']} typed errors "
                f"({dict(self.errors)}), {len(self.wrong)} wrong, {len(self.crashes)} crashes")


def run_fuzz(kind: str, n_cases: int, target: str, draft: str, seed: int = 0, timeout: float = 1800,
             on_case: Callable[[dict[str, Any]], None] | None = None) -> FuzzReport:
    """Runs cases 0..n_cases of `kind` in child processes, restarting after a crash."""
    report = FuzzReport(kind)
    start = 0
    script = str(Path(__file__).resolve())
    while start < n_cases:
        cmd = [sys.executable, script, "--target", target, "--draft", draft, "--kind", kind, "--seed", str(seed),
               "--start", str(start), "--stop", str(n_cases)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
        last_started = start - 1
        for line in proc.stdout.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in row:
                last_started = row["start"]
                continue
            report.n_cases += 1
            report.outcomes[row["outcome"]] += 1
            if row["outcome"] == "typed":
                report.errors[row["detail"]] += 1
            elif row["outcome"] == "wrong":
                report.wrong.append(f"case {row['case']}: {row['detail']}")
            if on_case:
                on_case(row)
        if proc.returncode == 0:
            break
        code = proc.returncode
        status = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if last_started < start:  # the fixture itself failed
            raise RuntimeError(f"fuzz child for {kind} failed before its first case ({status}):\n{proc.stderr[-2000:]}")
        report.n_cases += 1
        report.crashes.append(f"case {last_started}: {status}: {proc.stderr.strip()[-300:]}")
        start = last_started + 1
    return report


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
