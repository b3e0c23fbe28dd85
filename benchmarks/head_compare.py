"""Draft heads compared on the same data: the EAGLE-class head, the ReDrafter head and a draft
model, by held-out acceptance at depth 1..5 (teacher-forced, no timing).

    # 1. held-out data: the target's own greedy answers to prompts never trained on
    python benchmarks/head_compare.py data --out DIR \
        --prompts 'mtbench[0:20]' --prompts 'gsm8k[0:20]' --prompts 'humaneval[0:20]'
    # 2. each head trained on the same training data and kept vocabulary (resumable: rerun the
    #    same command after an interruption or a --max-minutes stop)
    python benchmarks/head_compare.py train --head eagle --data TRAIN_DIR --out DIR --epochs 1
    python benchmarks/head_compare.py train --head redrafter --data TRAIN_DIR --out DIR --epochs 1
    # 3. the draft model on the same held-out rows, then the tables
    python benchmarks/head_compare.py draft --out DIR --draft qwen2.5-coder-0.5b-instruct
    python benchmarks/head_compare.py report --out DIR
    # or a head `pyspec train-head` trained (its work directory: checkpoint and kept vocabulary)
    python benchmarks/head_compare.py eval --out DIR --work HEAD.gguf.work --name NAME
    # the costs of a drafted token (timing: the machine alone), for the flat-curve predictions
    python benchmarks/head_compare.py costs --out DIR --head-file HEAD.gguf

The measure, per held-out row t of the target's answer (the row that chose token x_{t+1}): at
depth k, does the drafter's top-1 for x_{t+k+1}, given the true x_{t+1..t+k}, equal the target's
argmax ("acc@k"), and are depths 1..k all right ("chain@k": what a greedy chain of k drafted
tokens gets accepted)? For a head, x_{t+1} is the target's token of the step, which the head
drafts after; the draft model is run over the same tokens (one pass) and read at the same rows.
1 + chain@1 + ... + chain@k is then the expected tokens per target call of a greedy chain of k.

Also: the kept vocabulary's coverage (share of held-out answer tokens a head can draft at all)
at several sizes, and each drafter's multiply-adds per drafted token against the target's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from pyspec.config import DEFAULT_TARGET
from pyspec.data import load_prompt_slices
from pyspec.models import resolve_model

DEPTH = 5
SUITES = ("mtbench", "gsm8k", "humaneval")


def suite_of(prompt_id: str) -> str:
    return "humaneval" if prompt_id.startswith("HumanEval") else prompt_id.split("/")[0]


def by_suite(held: list[Any], evaluate_seqs: Any) -> dict[str, Any]:
    """evaluate_seqs(sequences) of each suite's held-out sequences."""
    return {suite: evaluate_seqs(seqs) for suite in SUITES
            if (seqs := [s for s in held if suite_of(s.prompt_id) == suite])}


def held_out_sequences(out: Path) -> list[Any]:
    from pyspec.head.data import iter_sequences
    seqs = list(iter_sequences(out / "held-out"))
    if not seqs:
        raise SystemExit(f"no held-out data in {out / 'held-out'}; run the `data` step first")
    return seqs


def run_data(args: argparse.Namespace) -> None:
    from pyspec import Engine
    from pyspec.head.data import DataConfig, make_training_data, plan_sequences
    prompts = load_prompt_slices(args.prompts)
    plan = plan_sequences(prompts, (0.0,))
    with Engine(resolve_model(args.target), n_threads=args.threads, n_ctx=4096) as engine:
        t0 = time.time()
        made, _ = make_training_data(engine, plan, args.out / "held-out", DataConfig(max_tokens=args.max_tokens),
                                     on_sequence=lambda done, total: print(f"\rheld-out {done}/{total}", end=""))
    print(f"\n{made} sequences made in {time.time() - t0:.0f} s")


def vocabulary(args: argparse.Namespace, train: list[Any], n_vocab: int) -> np.ndarray:
    """The kept vocabulary both heads share, fixed in OUT/vocab-SIZE.npy at first use."""
    from pyspec.head.train import kept_vocabulary
    path = args.out / f"vocab-{args.kept_vocab}.npy"
    if not path.exists():
        np.save(path, kept_vocabulary(train, args.kept_vocab, n_vocab))
    return np.load(path)


def run_train(args: argparse.Namespace) -> None:
    import torch
    from pyspec.head.data import iter_sequences
    from pyspec.head.eagle import EagleConfig, EagleHead
    from pyspec.head.eagle_train import build_windows, evaluate_windows, window_loss
    from pyspec.head.gguf_io import new_head, read_target
    from pyspec.head.train import TrainConfig, build_examples, evaluate, train_head, write_report

    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(args.threads)
    target = resolve_model(args.target)
    held = held_out_sequences(args.out)
    held_ids = {s.prompt_id for s in held}
    train = [s for s in iter_sequences(args.data) if s.prompt_id not in held_ids]
    n_train_rows = sum(s.n_rows for s in train)
    print(f"{len(train)} training sequences, {n_train_rows} rows; {len(held)} held-out sequences")
    from pyspec.cli.train_head import _target_vocab_size
    vocab = vocabulary(args, train, _target_vocab_size(target))
    weights = read_target(target, vocab)
    column_of = np.full(weights.info.n_vocab, -1, dtype=np.int64)
    column_of[vocab] = np.arange(len(vocab))
    torch.manual_seed(0)
    name = "eagle-mlp" if args.head == "eagle" and args.no_attention else args.head
    work = args.out / f"{name}-{args.kept_vocab}"
    settings: dict[str, Any] = {"head": args.head, "kept_vocab": args.kept_vocab}
    if args.head == "eagle":
        cfg = EagleConfig(n_embd=weights.info.n_embd, n_target_vocab=weights.info.n_vocab, n_head=args.n_head,
                          n_ff=args.n_ff, attention=not args.no_attention)
        head = EagleHead(cfg, torch.from_numpy(vocab), torch.from_numpy(weights.embedding),
                         None if weights.output is None else torch.from_numpy(weights.output))
        settings.update(n_head=args.n_head, n_ff=args.n_ff, window=args.window, feature_weight=args.feature_weight,
                        attention=not args.no_attention)
        train_set = build_windows(train, column_of, args.train_depth, args.window)
        held_set = build_windows(held, column_of, DEPTH, 1 if args.no_attention else None)
        fw = args.feature_weight

        def loss_fn(h: Any, w: Any, idx: np.ndarray) -> Any:
            return window_loss(h, w, idx, fw)
        eval_fn = evaluate_windows
        batch = args.batch_size or 8
    else:
        head = new_head(weights, vocab, n_res_layers=args.res_layers)
        settings.update(res_layers=args.res_layers)
        train_set = build_examples(train, column_of, args.train_depth)
        held_set = build_examples(held, column_of, DEPTH)
        loss_fn, eval_fn = None, evaluate
        batch = args.batch_size or 128
    config = TrainConfig(depth=args.train_depth, epochs=args.epochs, batch_size=batch, lr=args.lr,
                         eval_every=10**9, checkpoint_every=20, threads=args.threads)
    extra = {"loss_fn": loss_fn} if loss_fn else {}
    t0 = time.time()
    last = [t0]

    def on_step(step: int, total: int, loss: float) -> None:
        if time.time() - last[0] > 30 or step == total:
            last[0] = time.time()
            print(f"step {step}/{total} loss {loss:.3f} ({(time.time() - t0) / 60:.1f} min)", flush=True)
    # Held-out evaluation runs once, at the end (eval_every is out of reach): it is a report,
    # not a training signal.
    state = train_head(head, train_set, None, config, work, on_step=on_step,
                       max_seconds=args.max_minutes * 60 if args.max_minutes else None, settings=settings,
                       **extra)
    if not state.finished:
        print(f"stopped at step {state.step} of {state.total}; rerun to continue")
        return
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    per_suite = by_suite(held, lambda seqs: eval_fn(head, (
        build_windows(seqs, column_of, DEPTH, 1 if args.no_attention else None) if args.head == "eagle"
        else build_examples(seqs, column_of, DEPTH))))
    report = {"head": args.head, "settings": settings, "config": asdict(config),
              "steps": state.step, "train_rows": n_train_rows, "train_sequences": len(train),
              "trainable_parameters": trainable, "macs_per_token": head_macs(head, args.head),
              "train_minutes": round((time.time() - t0) / 60, 1), "held_out": eval_fn(head, held_set),
              "per_suite": per_suite}
    write_report(work / "report.json", report)
    if args.head == "redrafter" or args.no_attention:
        from pyspec.head.gguf_io import export_head
        export_head(head, weights.info, work / "head.gguf", dtype="q8_0")
    print(json.dumps({k: report[k] for k in ("held_out", "per_suite")}, indent=1))


def run_eval(args: argparse.Namespace) -> None:
    """A head `pyspec train-head` trained, from its work directory (checkpoint, kept vocabulary),
    on the held-out rows: the same report as `train` writes, in OUT/NAME."""
    import torch
    from pyspec.head.eagle import EagleConfig, EagleHead
    from pyspec.head.eagle_train import build_windows, evaluate_windows
    from pyspec.head.gguf_io import new_head, read_target
    from pyspec.head.train import build_examples, evaluate, write_report

    torch.set_num_threads(args.threads)
    if args.work is None or not (args.work / "checkpoint.pt").exists():
        raise SystemExit(f"--work must be a train-head work directory with a checkpoint.pt, got {args.work}")
    ckpt = torch.load(args.work / "checkpoint.pt", weights_only=False)
    vocab = np.load(args.work / "vocab.npy")
    weights = read_target(resolve_model(args.target), vocab)
    column_of = np.full(weights.info.n_vocab, -1, dtype=np.int64)
    column_of[vocab] = np.arange(len(vocab))
    settings = dict(ckpt.get("settings") or {})
    output = None if weights.output is None else torch.from_numpy(weights.output)
    if settings.get("arch") == "eagle":
        kind = "eagle"
        head = EagleHead(EagleConfig(n_embd=weights.info.n_embd, n_target_vocab=weights.info.n_vocab,
                                     n_ff=int(settings["ff"]), attention=False),
                         torch.from_numpy(vocab), torch.from_numpy(weights.embedding), output)
        examples = lambda seqs: build_windows(seqs, column_of, DEPTH, 1)  # noqa: E731
        eval_fn = evaluate_windows
    else:
        kind = "redrafter"
        n_res = len({k.split(".")[1] for k in ckpt["head"] if k.startswith("res.")})
        head = new_head(weights, vocab, n_res_layers=n_res)
        examples = lambda seqs: build_examples(seqs, column_of, DEPTH)  # noqa: E731
        eval_fn = evaluate
    head.load_state_dict(ckpt["head"])
    held = held_out_sequences(args.out)
    per_suite = by_suite(held, lambda seqs: eval_fn(head, examples(seqs)))
    history = ckpt.get("history") or []
    minutes = (history[-1]["time"] - history[0]["time"]) / 60 if len(history) > 1 else None
    settings.update(head=kind, kept_vocab=int(len(vocab)))
    report = {"head": kind, "settings": settings, "config": ckpt["config"], "steps": ckpt["step"],
              "trainable_parameters": sum(p.numel() for p in head.parameters() if p.requires_grad),
              "macs_per_token": head_macs(head, kind),
              "train_minutes": None if minutes is None else round(minutes, 1),
              "held_out": eval_fn(head, examples(held)), "per_suite": per_suite, "work": str(args.work)}
    if not (args.out / f"vocab-{len(vocab)}.npy").exists():  # for the report's coverage table
        np.save(args.out / f"vocab-{len(vocab)}.npy", vocab)
    work = args.out / (args.name or f"{kind}-{len(vocab)}")
    work.mkdir(parents=True, exist_ok=True)
    write_report(work / "report.json", report)
    print(json.dumps({k: report[k] for k in ("held_out", "per_suite")}, indent=1))


def head_macs(head: Any, kind: str) -> int:
    """Multiply-adds of one draft step of one token (matrices only; attention over the context
    and the embedding lookup left out)."""
    d = head.config.n_embd
    n_out = head.n_kept * d
    if kind == "eagle":
        c = head.config
        return 2 * d * d + (4 * d * d if c.attention else 0) + 3 * d * c.n_ff + n_out
    layers = head.config.n_res_layers
    return 2 * d * d + layers * (2 * d) ** 2 + (2 * d * d if head.config.share_output else 0) + n_out


def run_draft(args: argparse.Namespace) -> None:
    from pyspec import Engine
    from pyspec.head.train import DepthTally
    held = held_out_sequences(args.out)
    per_suite: dict[str, DepthTally] = {}
    total = DepthTally(DEPTH)
    with Engine(resolve_model(args.target), draft=resolve_model(args.draft), n_threads=args.threads,
                n_ctx=4096) as engine:
        for i, seq in enumerate(held):
            logits = engine.evaluate(seq.tokens.tolist(), draft=True, all_rows=True, first_row=seq.first_row)
            draft_top = logits.argmax(axis=1)                          # row r: after token first_row + r
            target_top = seq.top_ids[:, 0]
            n = seq.n_rows
            target = np.arange(n - 1)[:, None] + np.arange(1, DEPTH + 1)   # [n - 1, DEPTH]
            exists = target < n
            safe = np.where(exists, target, 0)
            hits = draft_top[safe] == target_top[safe]
            for tally in (per_suite.setdefault(suite_of(seq.prompt_id), DepthTally(DEPTH)), total):
                tally.add(hits, exists)
            print(f"\rdraft {i + 1}/{len(held)}", end="")
    print()
    strip = lambda r: {k: r[k] for k in ("acc", "chain")}  # noqa: E731
    report = {"draft": args.draft, "held_out": strip(total.result()),
              "per_suite": {s: strip(t.result()) for s, t in per_suite.items()}}
    (args.out / "draft.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def run_costs(args: argparse.Namespace) -> None:
    """What a drafted token costs each drafter against a target token, in generation (medians of
    interleaved rounds on a held-out prompt): the target's time per call in plain decoding, the
    draft model's time per decode in a chain of 4 (its prompt's prefill left out), and a head
    step of one row (--head-file, DraftHead.step on the target's hidden state). OUT/costs.json;
    `report` then predicts each drafter's chain on a flat curve."""
    from pyspec import Engine
    from head_eval import median_ms

    if not args.head_file:
        raise SystemExit("costs needs --head-file HEAD.gguf (a head of the target)")
    seq = held_out_sequences(args.out)[0]
    with Engine(resolve_model(args.target), draft=resolve_model(args.draft), head=args.head_file,
                n_threads=args.threads, n_ctx=4096) as engine:
        head = engine._core.load_head(args.head_file)
        tokens = seq.tokens[: seq.first_row + 1].tolist()
        _, hidden = engine.evaluate_hidden(tokens)
        state = np.ascontiguousarray(hidden[-1:], dtype=np.float32)
        rows = [head.row_of(tokens[-1])]
        costs: dict[str, list[float]] = {"target": [], "draft": [], "head": []}
        for _ in range(args.rounds):
            plain = engine.generate(tokens, max_tokens=32, method="none").stats
            costs["target"].append(plain.t_verify_ms / max(plain.n_target_calls, 1))
            # The draft's prompt prefill is in its drafting time: two lengths, and the difference.
            short, long = (engine.generate(tokens, max_tokens=n, method="chain", n_draft=4).stats for n in (32, 96))
            costs["draft"].append((long.t_draft_ms - short.t_draft_ms)
                                  / max(long.n_draft_decodes - short.n_draft_decodes, 1))
            costs["head"].append(median_ms(lambda: head.step(state, np.zeros_like(state), rows), 5))
    med = {k: float(np.median(v)) for k, v in costs.items()}
    (args.out / "costs.json").write_text(json.dumps({"cost_ms": med, "head_file": str(args.head_file),
                                                     "rounds": args.rounds}, indent=1))
    print(json.dumps(med, indent=1))


def run_report(args: argparse.Namespace) -> None:
    from pyspec.head.train import coverage
    held = held_out_sequences(args.out)
    rows = []
    for path in sorted(args.out.glob("*/report.json")):
        r = json.loads(path.read_text())
        rows.append((f"{path.parent.name} ({r['settings']['kept_vocab']} kept)", r))
    draft_path = args.out / "draft.json"
    if draft_path.exists():
        d = json.loads(draft_path.read_text())
        rows.append((f"draft model {d['draft']}", d))
    lines = ["| drafter | suite | acc@1..5 | chain@1..5 | tokens per call, chain of 5 |", "|---|---|---|---|---|"]
    for name, r in rows:
        for suite, m in [("all", r["held_out"])] + sorted(r["per_suite"].items()):
            tpc = 1 + sum(m["chain"])
            lines.append(f"| {name} | {suite} | {' '.join(f'{x:.2f}' for x in m['acc'])} | "
                         f"{' '.join(f'{x:.2f}' for x in m['chain'])} | {tpc:.2f} |")
    cov = ["", "| kept vocabulary | held-out coverage |", "|---|---|"]
    for path in sorted(args.out.glob("vocab-*.npy"), key=lambda p: int(p.stem.split("-")[1])):
        vocab = np.load(path)
        for size in (4096, 8192, 16384, 32768, 65536):
            if size <= len(vocab):
                cov.append(f"| {size} (of vocab-{len(vocab)}) | {coverage(held, vocab[:size]):.4f} |")
    cost = ["", "| drafter | multiply-adds per drafted token |", "|---|---|"]
    cost += [f"| {name} | {r['macs_per_token'] / 1e6:.1f} M |" for name, r in rows if "macs_per_token" in r]
    flat: list[str] = []
    costs_path = args.out / "costs.json"
    if costs_path.exists():
        from head_eval import flat_chain_prediction
        ms = json.loads(costs_path.read_text())["cost_ms"]
        flat = ["", f"Flat verification curve (a step of any size costs one target token, T = {ms['target']:.1f} ms; "
                f"a head step {ms['head']:.2f} ms, a draft-model token {ms['draft']:.1f} ms): the best greedy chain",
                "", "| drafter | suite | best length | tokens per step | predicted speed-up over plain |", "|---|---|---|---|---|"]
        for name, r in rows:
            draft_ms = ms["draft"] if name.startswith("draft model") else ms["head"]
            for suite, m in [("all", r["held_out"])] + sorted(r["per_suite"].items()):
                chain = [1.0] + list(m["chain"])
                acc = [chain[k] / chain[k - 1] if chain[k - 1] else 0.0 for k in range(1, len(chain))]
                g, tokens, speedup = flat_chain_prediction(acc, draft_ms, ms["target"])
                flat.append(f"| {name} | {suite} | {g} | {tokens:.2f} | {speedup:.2f}x |")
    text = "\n".join(lines + cov + cost + flat)
    (args.out / "report.md").write_text(text + "\n")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("data", "train", "eval", "draft", "costs", "report"))
    p.add_argument("--out", type=Path, required=True, help="the comparison's directory")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--prompts", action="append", default=[], help="data: held-out prompt slices")
    p.add_argument("--max-tokens", type=int, default=128, help="data: answer length")
    p.add_argument("--data", type=Path, help="train: the training data directory (pyspec train-head's)")
    p.add_argument("--head", choices=("eagle", "redrafter"), default="eagle")
    p.add_argument("--kept-vocab", type=int, default=32768)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=0, help="windows (eagle, default 8) or rows (redrafter, 128)")
    p.add_argument("--train-depth", type=int, default=3, help="draft steps trained per anchor")
    p.add_argument("--window", type=int, default=256, help="eagle: rows per training window")
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-ff", type=int, default=4096)
    p.add_argument("--no-attention", action="store_true", help="eagle: the layer without attention (its MLP alone)")
    p.add_argument("--feature-weight", type=float, default=0.1)
    p.add_argument("--res-layers", type=int, default=1)
    p.add_argument("--max-minutes", type=float, default=None, help="train: stop (resumably) after this long")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--work", type=Path, help="eval: a `pyspec train-head` work directory")
    p.add_argument("--name", help="eval: the report's name in OUT (default HEAD-KEPT)")
    p.add_argument("--head-file", help="costs: a head GGUF of the target, timed per draft step")
    p.add_argument("--rounds", type=int, default=7, help="costs: interleaved timing rounds")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    {"data": run_data, "train": run_train, "eval": run_eval, "draft": run_draft, "costs": run_costs,
     "report": run_report}[args.step](args)


if __name__ == "__main__":
    main()
