"""A head's accuracy on plain decoding's output for one held-out prompt, teacher-forced in PyTorch.

    python benchmarks/head_teacher_forced.py --head HEAD.gguf --out EVAL --prompt HumanEval/156 \
        --slice 'humaneval[156:164]'

Reads plain decoding's tokens from head_eval.py's record (EVAL/quality/<prompt>.json), evaluates
prompt + output once with hidden states, runs the PyTorch head (loaded from the GGUF) from every
output row with the true following tokens, and prints acc@k (the head's top-1 equals the target's
argmax at depth k) and chain@k (depths 1..k all right), next to the depth counts of the engine's
greedy chain (redrafter 1x5) on the same prompt: where they agree, the engine runs the head it
was given on the right rows, and acceptance is what the head knows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from pyspec import Engine
from pyspec.data import load_prompt_slices
from pyspec.head.gguf_io import load_head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", required=True)
    ap.add_argument("--out", required=True, help="head_eval.py's output directory")
    ap.add_argument("--prompt", required=True, help="prompt id, e.g. HumanEval/156")
    ap.add_argument("--slice", required=True, help="a suite slice holding it, e.g. 'humaneval[156:164]'")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    head, _ = load_head(args.head)
    head.eval()
    record = json.loads((Path(args.out) / "quality" / f"{args.prompt.replace('/', '_')}.json").read_text())
    prompt = next(p for p in load_prompt_slices([args.slice]) if p.id == args.prompt)
    with Engine(args.target, n_ctx=4096, n_threads=args.threads) as engine:
        prompt_tokens = engine.prompt_tokens(prompt.messages)
        tokens = prompt_tokens + record["plain_tokens"]
        logits, hidden = engine.evaluate_hidden(tokens)
    target_argmax = logits.argmax(axis=1)  # [n_tokens] row j: the target's choice after tokens[j]
    vocab = head.vocab.numpy()
    L = args.depth
    hits, chain, counted = np.zeros(L), np.zeros(L), np.zeros(L)
    with torch.no_grad():
        # Row j chose tokens[j + 1] (= g0); depth k predicts the token after tokens[j + 1 + k].
        for j in range(len(prompt_tokens) - 1, len(tokens) - 2):
            following = tokens[j + 1: j + 1 + L]
            out = head(torch.from_numpy(hidden[j:j + 1].astype(np.float32)), torch.tensor([following]))[0]
            predicted = vocab[out.argmax(-1).numpy()]
            all_right = True
            for k in range(len(following)):
                if j + 1 + k >= len(tokens):
                    break
                right = bool(predicted[k] == target_argmax[j + 1 + k])
                all_right = all_right and right
                hits[k] += right
                chain[k] += all_right
                counted[k] += 1
    counted = np.maximum(counted, 1)
    print(json.dumps({"prompt": args.prompt, "rows": int(counted[0]), "acc": (hits / counted).round(3).tolist(),
                      "chain": (chain / counted).round(3).tolist(),
                      "engine_1x5_depth_counts": record.get("redrafter:1x5", {}).get("depth_counts")}))


if __name__ == "__main__":
    main()
