"""What verification pays for its logits: one decode of k tokens with a logits row for every
token (as verification needs them) against one with only the last token's row (as a prompt
pass, and `llama-bench`'s pp test, compute it), side by side at each size.

The output matrix (151,936 x 1,536 for the Qwen2.5 targets, Q6_K in the Q4_K_M files, which ggml
does not repack on x86) is applied to every row that asks for logits, so a verification step of
k tokens costs more than a prompt batch of k tokens; `llama-bench`'s pp figures are therefore a
lower bound on the engine's cost curve, not the curve. llama.cpp's own speculative tools need
every row too, so this is a cost both sides pay. Through llama-cpp-python's low-level API on one
context (flash attention off, as the engine runs), the sizes interleaved, the cache cut back to
the context after each decode; the median of the repeats. A timing: run it with the machine
idle.

    python benchmarks/logit_rows_cost.py --contexts 0,2000 --sizes 1,4,8,16,32,64
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp as L

from pyspec.models import resolve_model

TARGET = "qwen2.5-coder-1.5b-instruct"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--contexts", default="0,2000", help="comma-separated tokens already in the cache")
    ap.add_argument("--sizes", default="1,4,8,16,32,64", help="comma-separated tokens per decode")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    sizes = [int(k) for k in args.sizes.split(",")]
    if min(sizes) < 1 or max(sizes) > 512 or min(contexts) < 0:
        raise SystemExit("--sizes must be 1..512 and --contexts >= 0")

    L.llama_backend_init()
    model = L.llama_model_load_from_file(resolve_model(args.target).encode(), L.llama_model_default_params())
    cparams = L.llama_context_default_params()
    cparams.n_ctx = max(contexts) + max(sizes) + 16
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_threads = cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cparams)
    memory = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(512, 0, 1)

    def decode(tokens: list[int], pos0: int, all_rows: bool) -> float:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_rows or i == len(tokens) - 1 else 0
        batch.n_tokens = len(tokens)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed at {len(tokens)} tokens after {pos0}")
        return (time.perf_counter() - t0) * 1e3

    try:
        print("ms per decode of k tokens, logits for every row / for the last row only (median of "
              f"{args.repeats})")
        for c in contexts:
            L.llama_memory_clear(memory, True)
            filler = [100 + (i * 7919) % 30000 for i in range(c)]  # any tokens: attention cost only
            for s in range(0, c, 512):
                decode(filler[s:s + 512], s, False)
            times: dict[tuple[int, bool], list[float]] = {}
            for _ in range(args.repeats):
                for k in sizes:
                    for all_rows in (True, False):
                        times.setdefault((k, all_rows), []).append(decode([1000 + j for j in range(k)], c, all_rows))
                        L.llama_memory_seq_rm(memory, 0, c, -1)
            for k in sizes:
                every, last = statistics.median(times[k, True]), statistics.median(times[k, False])
                print(f"context {c:5d}  k {k:3d}: {every:7.1f} / {last:7.1f} ms, every row costs "
                      f"{every / last - 1:+.0%} ({(every - last) / max(k - 1, 1):.1f} ms per extra row)")
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


if __name__ == "__main__":
    main()
