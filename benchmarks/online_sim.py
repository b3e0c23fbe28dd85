"""The stream experiment's training replayed without serving: which settings make the
derived draft learn chat?

    # once: the target's greedy answers and its rows over them (and over the prompts) for the
    # stream and for --heldout prompts per suite after it (~15 min on 2 cores), kept in --data
    python benchmarks/online_sim.py --data sim.pkl --collect \\
        --stream humaneval:50,gsm8k:50,mtbench:50 --heldout 24 --max-tokens 32
    # then any number of training settings against the same data (minutes each)
    python benchmarks/online_sim.py --data sim.pkl --draft qwen6.gguf --lr 1e-4 --lr-schedule inverse_sqrt \\
        --epochs 2 --batch-size 4 --rehearsal 0.5 --no-train-vocab --json run.json

The online loop trains on exactly what this replays: with positions="all" and --wait-updates a
request's training sample is the target's greedy answer with the target's top-k at every answer
position, whatever the draft drafted (the draft never changes the output). This script collects
those samples once with plain decoding, then runs the distiller's schedule on them: the same
ReplayBuffer (rehearsal, release), an update after every --update-interval requests, the same
DraftTrainer state (float32 master weights, AdamW, lr schedule), in one process without the
engine or the export. Acceptance is computed, not served: a greedy chain of --n-draft tokens
drafted by the student on the target's answer, teacher-forced (the draft's token at a position
is its argmax over the answer so far; a step accepts the drafted tokens up to the first that
differs from the target's and then commits the target's next token, as the engine does), on the
student's float32 weights. What the engine measures differs by the export's rounding to the
source's types and by the target's near-ties (batched vs one-token numerics); a setting chosen
here is confirmed by the real stream run (online_stream.py).

Reported: the acceptance of every request by the draft version that would have served it
(along the stream, window and per suite, as online_stream.py reports them), and the final
draft's acceptance on the held-out prompts of each suite (the first 8, as the stream
experiment's held-out rows, and all of --heldout).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from online_stream import heldout_acceptance, load_stream  # this script's directory is on sys.path

from pyspec.online.config import TRAIN_BLOCKS_HELP, DistillConfig  # no torch: plain settings


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Serves the stream and the held-out prompts with the target alone (greedy): each
    request's answer sample (every position) and prompt sample (the prompt's positions after
    its common prefix with the previous request's prompt, as DistillConfig.prompt_positions)."""
    from tqdm import tqdm

    import pyspec
    from pyspec.online.buffer import common_prefix_length, prompt_sample, samples_from_result

    stream, rest = load_stream(args.stream, args.raw, held_out=args.heldout)
    out: dict[str, Any] = {"stream_spec": args.stream, "max_tokens": args.max_tokens, "top_k": args.top_k,
                           "stream": [], "heldout": []}
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads) as engine:
        last_prompt: list[int] = []
        for part, prompts in (("stream", stream), ("heldout", rest)):
            for index, (suite, prompt) in enumerate(tqdm(prompts, desc=part, file=sys.stderr)):
                result = engine.generate(prompt, max_tokens=args.max_tokens, method="none", return_logits=True)
                answer = samples_from_result(result, positions="all", top_k=args.top_k, request=index, domain=suite)
                tokens = list(result.prompt_tokens)
                first = common_prefix_length(tokens, last_prompt) if part == "stream" else None
                last_prompt = tokens if part == "stream" else last_prompt
                prompt_part = None
                if first is not None and first < len(tokens) - 1:
                    rows = engine.evaluate(tokens[:-1], all_rows=True, first_row=first)
                    prompt_part = prompt_sample(tokens, first, rows, top_k=args.top_k, request=index, domain=suite)
                out[part].append({"suite": suite, "answer": answer, "prompt": prompt_part})
    return out


def chain_acceptance(draft_argmax: list[int], target: list[int], n_draft: int) -> tuple[int, int]:
    """(drafted, accepted) of a greedy chain of n_draft over an answer, teacher-forced:
    draft_argmax[i] is the draft's token for answer position i given the answer before it."""
    drafted = accepted = 0
    i, n = 0, len(target)
    while i < n - 1:  # the last token is the target's own: nothing is left to draft for it
        k = min(n_draft, n - 1 - i)
        drafted += k
        a = 0
        while a < k and draft_argmax[i + a] == target[i + a]:
            a += 1
        accepted += a
        i += a + 1
    return drafted, accepted


def answer_acceptance(student: Any, sample: Any, n_draft: int, served: Any = None) -> tuple[int, int]:
    """Chain acceptance of the draft on one answer: the student's float32 weights in torch, or,
    with `served` (an Engine holding the exported draft as its model), llama.cpp's logits of
    the file the engine would serve."""
    import numpy as np
    import torch

    from pyspec.online.trainer import student_row_logits

    if served is not None:
        draft_argmax = served.evaluate(sample.tokens.tolist(), all_rows=True, first_row=int(sample.rows[0])).argmax(1)
        draft_argmax = draft_argmax[sample.rows - sample.rows[0]].tolist()
    else:
        with torch.no_grad():
            draft_argmax = student_row_logits(student, sample).argmax(dim=1).tolist()
    return chain_acceptance(draft_argmax, sample.top_ids[:, 0].astype(np.int64).tolist(), n_draft)


class ServedDraft:
    """The trained draft as the engine would serve it: the file an update exported (in
    config.export_dtype), loaded by llama.cpp; the file it replaces is removed."""

    def __init__(self, path: str, threads: int) -> None:
        self.threads, self.path = threads, None
        self.engine = self._open(path)

    def _open(self, path: str) -> Any:
        import pyspec

        return pyspec.Engine(path, n_ctx=4096, n_threads=self.threads, prefix_cache=False)

    def load(self, path: Path) -> None:
        self.engine.close()
        self.engine = self._open(str(path))
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        self.path = path


def heldout_by_suite(student: Any, heldout: list[dict[str, Any]], n_draft: int) -> dict[str, float | None]:
    """The student's (float32) acceptance on all held-out prompts, per suite."""
    pairs: dict[str, list[tuple[int, int]]] = {}
    for item in heldout:
        pairs.setdefault(item["suite"], []).append(answer_acceptance(student, item["answer"], n_draft))
    return {suite: pooled(p) for suite, p in pairs.items()}


def pooled(pairs: list[tuple[int, int]]) -> float | None:
    drafted = sum(d for d, _ in pairs)
    return sum(a for _, a in pairs) / drafted if drafted else None


def simulate(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    from pyspec.online.buffer import ReplayBuffer, merge_samples
    from pyspec.online.trainer import DraftTrainer

    config = DistillConfig(loss=args.loss, tau=args.tau, positions="all", top_k=data["top_k"],
                           export_dtype=args.export_dtype,
                           prompt_positions=args.prompt_positions, lr=args.lr, lr_schedule=args.lr_schedule,
                           weight_decay=args.weight_decay, epochs=args.epochs, batch_size=args.batch_size,
                           rehearsal=args.rehearsal, rehearsal_limit=args.rehearsal_limit,
                           train_vocab=args.train_vocab, train_blocks=args.train_blocks,
                           train_threads=args.train_threads, seed=args.seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyspec-sim-") as work:
        trainer = DraftTrainer(args.draft, config, work)
        student = trainer.student
        buffer = ReplayBuffer(args.buffer_limit, rehearsal_limit=config.rehearsal_limit if config.rehearsal > 0 else 0,
                              seed=config.seed)
        served = ServedDraft(args.draft, args.train_threads) if args.served else None
        requests, updates, since = [], [], 0
        boundaries = {}  # suite -> the final-so-far draft's held-out acceptance when the stream reaches it
        for index, item in enumerate(data["stream"]):
            if index and item["suite"] != data["stream"][index - 1]["suite"]:
                boundaries[item["suite"]] = heldout_by_suite(student, data["heldout"], args.n_draft)
            engine = served.engine if served else None
            drafted, accepted = answer_acceptance(student, item["answer"], args.n_draft, engine)
            requests.append({"index": index, "suite": item["suite"], "version": trainer.n_updates + 1,
                             "drafted": drafted, "accepted": accepted})
            sample = item["answer"]
            if config.prompt_positions:
                sample = merge_samples(sample, item["prompt"])
            buffer.add(sample)
            since += 1
            if since >= args.update_interval:
                since = 0
                samples = buffer.snapshot()
                n_new = sum(s.n_rows for s in samples)
                rehearsed = buffer.rehearsal(int(config.rehearsal * n_new)) if config.rehearsal > 0 else []
                path, report = trainer.update(samples, rehearsed, export=served is not None)
                buffer.release(samples)
                if served:
                    served.load(path)
                updates.append({"after": index + 1, "lr": report.lr, "positions": report.n_positions,
                                "rehearsed": report.n_rehearsed, "loss_before": report.loss_before,
                                "loss_after": report.loss_after, "seconds": report.seconds})
                print(f"update {trainer.n_updates} after {index + 1}: lr {report.lr:.2e}, "
                      f"{report.n_positions} positions, loss {report.loss_before:.3f} -> {report.loss_after:.3f}, {report.seconds:.1f} s",
                      file=sys.stderr)
        heldout = []
        for item in data["heldout"]:
            drafted, accepted = answer_acceptance(student, item["answer"], args.n_draft)
            row = {"suite": item["suite"], "drafted": drafted, "accepted": accepted}
            if served:
                row["served_drafted"], row["served_accepted"] = answer_acceptance(
                    student, item["answer"], args.n_draft, served.engine)
            heldout.append(row)
        if served:
            served.engine.close()
    return {"config": config.__dict__, "n_draft": args.n_draft, "update_interval": args.update_interval,
            "requests": requests, "updates": updates, "heldout": heldout,
            "heldout_at_suite_start": boundaries, "seconds": time.perf_counter() - t0}


def summary(run: dict[str, Any], window: int, first_heldout: int) -> dict[str, Any]:
    requests, suites = run["requests"], list(dict.fromkeys(r["suite"] for r in run["requests"]))
    held = run["heldout"]

    def acc(rows: list[dict[str, Any]]) -> float | None:
        return pooled([(r["drafted"], r["accepted"]) for r in rows])

    out = {"stream": {s: acc([r for r in requests if r["suite"] == s]) for s in suites},
           "window_end": acc(requests[-window:]), "heldout_at_suite_start": run.get("heldout_at_suite_start", {})}
    # held-out rows as online_stream.py keeps them ([suite, drafted, accepted] per prompt and mode)
    rows = {"": [[h["suite"], h["drafted"], h["accepted"]] for h in held],
            "served_": [[h["suite"], h["served_drafted"], h["served_accepted"]] for h in held if "served_drafted" in h]}
    rows = {prefix: r for prefix, r in rows.items() if r}
    for label, first in ((f"heldout_first{first_heldout}", first_heldout), ("heldout_all", None)):
        for prefix, by_mode in heldout_acceptance(rows, first).items():
            out[prefix + label] = by_mode
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="samples file (written by --collect, read otherwise)")
    parser.add_argument("--collect", action="store_true", help="serve the prompts with the target and write --data")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--stream", default="humaneval:50,gsm8k:50,mtbench:50")
    parser.add_argument("--heldout", type=int, default=24, help="held-out prompts per suite after its stream part")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--raw", action="store_true", help="plain text prompts, no chat template")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft", help="the draft GGUF to train (a path or registry name)")
    parser.add_argument("--n-draft", type=int, default=2)
    parser.add_argument("--update-interval", type=int, default=8)
    parser.add_argument("--buffer-limit", type=int, default=4096)
    parser.add_argument("--loss", default="fkl")
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--prompt-positions", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lr-schedule", default="inverse_sqrt")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rehearsal", type=float, default=0.5)
    parser.add_argument("--rehearsal-limit", type=int, default=16384)
    parser.add_argument("--no-train-vocab", dest="train_vocab", action="store_false")
    parser.add_argument("--train-blocks", type=int, default=0, help=TRAIN_BLOCKS_HELP)
    parser.add_argument("--train-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-dtype", default="source", help="the served draft's type (with --served)")
    parser.add_argument("--served", action="store_true",
                        help="acceptance of the exported draft as llama.cpp runs it (export + reload per update), "
                             "held out on both the float32 weights and the served file")
    parser.add_argument("--window", type=int, default=25)
    parser.add_argument("--json", help="write the run (requests, updates, held-out, summary) here")
    args = parser.parse_args(argv)

    if args.collect:
        data = collect(args)
        with open(args.data, "wb") as f:
            pickle.dump(data, f)
        print(f"{len(data['stream'])} stream and {len(data['heldout'])} held-out requests -> {args.data}")
        return 0
    if not args.draft:
        parser.error("--draft is needed to train (or --collect to gather the data)")
    from pyspec.models import resolve_model

    args.draft = resolve_model(args.draft)
    with open(args.data, "rb") as f:
        data = pickle.load(f)
    run = simulate(args, data)
    run["summary"] = summary(run, args.window, 8)
    print(json.dumps(run["summary"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(run, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
