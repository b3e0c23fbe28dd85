"""The Python package: pyspec.Engine.generate.  python_cost.py MODEL.gguf METHOD MAX_TOKENS"""

import sys

import pyspec

model, method, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
with pyspec.Engine(model, draft=model, n_ctx=1024, n_threads=1) as engine:
    r = engine.generate("class Counter:", method=method, max_tokens=max_tokens)
    print(f"{len(r.tokens)} tokens, {r.stats.n_target_calls} target calls")
