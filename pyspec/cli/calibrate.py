"""`pyspec calibrate`: measure and cache the cost curves method auto plans with (pyspec.calibration)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..calibration import CALIBRATION_SIZES, FLASH_ATTN_BATCH, forget_flash_attn
from ..config import DEFAULT_DRAFT, DEFAULT_TARGET
from .options import add_engine_options, add_rpc_option, engine_options



def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..engine import Engine

    def load() -> Engine:
        return Engine(args.target, draft=args.draft or None, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                      rpc=args.rpc, head=False, **engine_options(args))

    engine = load()
    if args.force and engine._flash_attn_key is not None and not engine._flash_attn_measured:
        # --force decides flash attention again too: forget the cached choice and load anew
        engine.close()
        forget_flash_attn(engine._flash_attn_key)
        engine = load()
    with engine:
        curves = engine.calibrate(force=args.force, repeats=args.repeats)
        decision = engine.flash_attn_decision
        fa = {"on": engine.flash_attn, "mode": engine.flash_attn_mode}
        if decision is not None:
            fa.update(at_depth=decision.at_depth, plain=round(decision.plain_ratio, 3),
                      verify=round(decision.verify_ratio, 3), ratio=round(decision.ratio_at_depth, 3))
    payload: dict[str, Any] = {name: {"n_tokens": list(c.n_tokens), "ms": [round(t, 2) for t in c.ms]}
                               for name, c in curves.items()}
    if args.json:
        print(json.dumps({**payload, "flash_attn": fa}))
        return 0
    print(f"flash attention: {'on' if fa['on'] else 'off'} ({fa['mode']}"
          + (f": at {fa['at_depth']} tokens of context it costs a plain step x{fa['plain']:.3f} and an "
             f"{FLASH_ATTN_BATCH}-token verification x{fa['verify']:.3f}" if decision is not None else "") + ")")
    for name, c in curves.items():
        print(f"{name}: one decode of k tokens (ms, and relative to k=1)")
        print("  k    " + " ".join(f"{k:>7d}" for k in c.n_tokens))
        print("  ms   " + " ".join(f"{t:7.1f}" for t in c.ms))
        print("  x1   " + " ".join(f"{r:7.2f}" for r in c.relative()))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure (and cache) the cost of decoding k tokens, for method auto",
        description=f"Times one decode of {CALIBRATION_SIZES[0]}..{CALIBRATION_SIZES[-1]} tokens for the target (all logits rows) and the draft "
                    "(last row) with these threads and offload, and caches the curves; method auto "
                    "loads them (or measures on first use).")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"GGUF path or registry name (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help=f"GGUF path or registry name, '' for none (default {DEFAULT_DRAFT})")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--n-gpu-layers", type=int, default=None,
                   help="layers to offload, -1 all (GPU builds only; default $PYSPEC_N_GPU_LAYERS, else 0)")
    add_engine_options(p)
    add_rpc_option(p)
    p.add_argument("--repeats", type=int, default=3, help="rounds over all sizes; the median is kept (default 3)")
    p.add_argument("--force", action="store_true",
                   help="measure again even when a cached curve (and flash-attention choice) exists")
    p.add_argument("--json", action="store_true", help="print the curves as JSON")
    p.set_defaults(handler=_cmd_calibrate)
