"""An engine's life around its calls: close() while other threads save, load and read the pool or
tokenize; an error in mid-generation (the output so far is kept); Ctrl-C during a generation that
has no text callback; model loads on several threads at once (each error quotes its own reason)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from isolated import run_json

import pyspec
from pyspec import GenerationConfig

# Runs in a child: a use after free ends the process (before the fix: SIGSEGV in some rounds).
CLOSE_WHILE_BUSY = """
import json, random, sys, threading, time
import pyspec

target, out_dir = sys.argv[1:3]
rng = random.Random(0)
calls = {}
unexpected = []
for round_ in range(8):
    engine = pyspec.Engine(target, n_ctx=1024, n_threads=1)
    if round_ == 0:  # a pool of ~30k phrases, so that a save takes a while
        for _ in range(30):
            engine.generate([rng.randrange(256) for _ in range(1000)], max_tokens=1, method="lookup")
        engine.save_pool(f"{out_dir}/full.pool")
    else:
        engine.load_pool(f"{out_dir}/full.pool")

    def loop(name, call):
        while True:
            try:
                call()
                calls[name] = calls.get(name, 0) + 1
            except pyspec.EngineClosedError:
                return
            except BaseException as exc:
                unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
                return

    workers = [
        threading.Thread(target=loop, args=("save", lambda: engine.save_pool(f"{out_dir}/saved.pool"))),
        threading.Thread(target=loop, args=("load", lambda: engine.load_pool(f"{out_dir}/full.pool"))),
        threading.Thread(target=loop, args=("stats", engine.pool_stats)),
        threading.Thread(target=loop, args=("tokenize", lambda: engine.tokenize("hello " * 50))),
        threading.Thread(target=loop, args=("detokenize", lambda: engine.detokenize(list(range(60, 200))))),
    ]
    for w in workers:
        w.start()
    time.sleep(0.01 + 0.02 * round_)
    engine.close()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers), "a worker hangs after close()"
print(json.dumps({"calls": calls, "unexpected": unexpected}))
"""


def test_close_while_other_threads_use_the_pool_and_tokenizer(tiny_target: str, tmp_path: Path) -> None:
    out = run_json(CLOSE_WHILE_BUSY, tiny_target, str(tmp_path), timeout=600)
    assert out["unexpected"] == []
    assert out["calls"].get("save", 0) > 0 and out["calls"].get("load", 0) > 0  # the race was really run


def test_error_in_mid_generation_keeps_the_output(engines) -> None:
    engine = engines["perturbed"]
    tokens = engine.tokenize("The quick brown")
    config = GenerationConfig(max_tokens=60, method="chain", n_draft=4)
    reference = engine._run(tokens, config, None)
    pieces: list[str] = []

    def fail_on_tenth(chunk: pyspec.StreamChunk) -> bool:
        if len(pieces) == 9:
            raise RuntimeError("consumer went away")
        pieces.append(chunk.text)
        return True

    with pytest.raises(RuntimeError, match="consumer went away") as caught:
        engine._run(tokens, config, fail_on_tenth)
    partial = caught.value.partial_result
    assert partial.finish_reason == "error"
    assert 9 <= len(partial.tokens) < len(reference.tokens)
    assert partial.tokens == reference.tokens[: len(partial.tokens)]
    assert partial.text.startswith("".join(pieces))
    assert partial.stats.n_generated == len(partial.tokens)
    assert partial.method == "chain"
    # Errors raised before the generation starts carry no partial result.
    with pytest.raises(pyspec.InvalidArgumentError) as early:
        engine.generate("x", max_tokens=-1)
    assert not hasattr(early.value, "partial_result")
    assert engine._run(tokens, config, None).tokens == reference.tokens


# Runs in a child that sends itself SIGINT while a generation without callback runs.
CTRL_C = """
import json, os, signal, sys, threading, time
import pyspec

# A process started in the background by a shell inherits SIGINT ignored, and Python then keeps
# it ignored: Ctrl-C is restored here as an interactive Python has it.
signal.signal(signal.SIGINT, signal.default_int_handler)
engine = pyspec.Engine(sys.argv[1], n_ctx=4096, n_threads=1)
max_tokens = 4000
# The tiny model makes thousands of tokens a second and a loaded machine may run the timer late:
# Ctrl-C is pressed every 20 ms from an eighth of the way into a generation as long as the one
# timed first (which must run to its end), until the generation returns.
t0 = time.monotonic()
assert len(engine.generate("hello", max_tokens=max_tokens, method="none").tokens) == max_tokens
full_seconds = time.monotonic() - t0
pressing = threading.Event()
pressing.set()

def press():
    time.sleep(full_seconds / 8)
    while pressing.is_set():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.02)

presser = threading.Thread(target=press)
presser.start()
t0 = time.monotonic()
out = {}
try:
    result = engine.generate("hello", max_tokens=max_tokens, method="none")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out["finished"] = len(result.tokens)
except KeyboardInterrupt as exc:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    partial = getattr(exc, "partial_result", None)
    out["seconds"] = time.monotonic() - t0
    out["partial_tokens"] = None if partial is None else len(partial.tokens)
    out["finish_reason"] = None if partial is None else partial.finish_reason
pressing.clear()
presser.join()
out["usable_after"] = len(engine.generate("hello", max_tokens=5, method="none").tokens) == 5
print(json.dumps(out))
"""


def test_ctrl_c_interrupts_a_generation_without_callback(tiny_target: str) -> None:
    out = run_json(CTRL_C, tiny_target)
    assert "finished" not in out, f"the generation ran to its end ({out}) instead of stopping at Ctrl-C"
    assert out["partial_tokens"] is not None and 0 < out["partial_tokens"] < 4000, out
    assert out["finish_reason"] == "error"
    assert out["usable_after"]


def bad_architecture_gguf(path: Path, arch: str) -> str:
    """A GGUF that parses but names an architecture llama.cpp does not know."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_concurrent_load_errors_quote_their_own_reason(tmp_path: Path) -> None:
    """llama.cpp's reason for refusing a file is quoted in the error of the thread that loaded it,
    never in another thread's (the recent-error buffer used to be shared by the process)."""
    files = {arch: bad_architecture_gguf(tmp_path / f"{arch}.gguf", arch) for arch in ("pyspecarcha", "pyspecarchb")}
    wrong: list[str] = []
    n_errors = {arch: 0 for arch in files}

    def load_repeatedly(arch: str) -> None:
        other = next(a for a in files if a != arch)
        for _ in range(100):
            try:
                pyspec.Engine(files[arch], n_ctx=128)
                wrong.append(f"{arch}: loaded")
            except pyspec.ModelLoadError as exc:
                n_errors[arch] += 1
                message = str(exc)
                reason = message.split("\nllama.cpp: ", 1)[1] if "\nllama.cpp: " in message else ""
                if f"'{arch}'" not in reason or other in reason:
                    wrong.append(f"{arch}: {message}")

    threads = [threading.Thread(target=load_repeatedly, args=(arch,)) for arch in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert all(n == 100 for n in n_errors.values())
    assert os.path.exists(files["pyspecarcha"])
