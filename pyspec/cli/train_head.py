"""`pyspec train-head`: make the data with the target, train a draft head, export its GGUF."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_PROMPTS = ("humaneval[0:120]", "mtbench[0:60]", "gsm8k[0:120]")


# What each option is when neither it nor a --preset sets it.
BUILTIN = {"arch": "redrafter", "reference": False, "kept_vocab": 16384, "depth": 5, "epochs": 3.0, "bf16": False,
           "eval_every": 100}

# --preset: settings that make a head for the default target in a stated time on a small CPU
# (docs/results-heads.md has what each made and how long it took). Options given on the command
# line win over the preset's.
PRESETS: dict[str, dict[str, Any]] = {
    # An EAGLE-class head from teacher-forced reference answers: 580 sequences, 207k rows (about
    # 45 minutes of data on 2 cores for the 1.5B target), then 3 epochs over them (about 35
    # minutes with bfloat16 products).
    "eagle": {"arch": "eagle", "reference": True,
              "prompts": ["sharegpt[0:229]", "gsm8k[100:329]", "humaneval[40:164]"],
              "kept_vocab": 16384, "depth": 4, "epochs": 3.0, "bf16": "auto", "eval_every": 300},
}


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), where bfloat16
    training products pay; elsewhere they can be slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def apply_preset(args: argparse.Namespace) -> None:
    """Fills the options the command line left unset from --preset, then from BUILTIN."""
    preset = PRESETS[args.preset] if getattr(args, "preset", None) else {}
    for key in set(BUILTIN) | set(preset):
        if getattr(args, key, None) is None:
            value = preset.get(key, BUILTIN.get(key))
            value = cpu_has_bf16() if value == "auto" else value
            setattr(args, key, list(value) if isinstance(value, list) else value)  # a copy of the preset's list


def _interleave(groups: list[list[Any]]) -> list[Any]:
    """Round-robin over the groups, so that any prefix mixes them (an interrupted data run)."""
    out: list[Any] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def _progress(desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True, disable=None)


def run_train_head(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from .options import engine_options
    from ..config import DEFAULT_TARGET
    from ..engine import Engine
    from ..models import resolve_model
    from ..data import load_prompt_slices
    from ..head.data import DataConfig, iter_sequences, make_training_data, plan_sequences
    from ..head.gguf_io import export_head, load_head, new_head, read_target
    from ..head.train import TrainConfig, build_examples, coverage, is_held_out, kept_vocabulary, train_head, write_report

    given_arch = args.arch  # before the defaults: --init-from's head decides it when not given
    apply_preset(args)
    target = resolve_model(args.target or DEFAULT_TARGET)
    out = Path(args.out)
    work = Path(args.work_dir) if args.work_dir else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data)
    report: dict[str, Any] = {"target": os.path.basename(target), "data": str(data_dir), "out": str(out)}

    # 1. Data: the target's answers, hidden states and distributions (missing sequences only).
    # --time-budget covers data and training together: a run out of time while making data stops
    # there (no training), and the next run makes the rest.
    t0 = time.time()
    deadline = time.monotonic() + args.time_budget if args.time_budget is not None else None
    if args.prompts:
        groups = [load_prompt_slices([spec]) for spec in args.prompts]
        plan = plan_sequences(_interleave(groups), args.temperatures, args.sampled_every, reference=args.reference)
        bar = _progress("data")
        bar.total = len(plan)
        with Engine(target, n_threads=args.threads, n_ctx=args.n_ctx, head=False, **engine_options(args)) as engine:
            config = DataConfig(max_tokens=args.max_tokens, reference_max_tokens=args.reference_max_tokens)
            made, complete = make_training_data(engine, plan, data_dir, config,
                                                on_sequence=lambda done, total: bar.update(done - bar.n),
                                                deadline=deadline)
        bar.close()
        report.update(data_made=made, data_planned=len(plan))
        if not complete:
            report.update(data_seconds=round(time.time() - t0, 1), finished=False, step=0, total_steps=None)
            return report
    report["data_seconds"] = round(time.time() - t0, 1)
    sequences = list(iter_sequences(data_dir))
    if not sequences:
        raise ValueError(f"no training sequences in {data_dir}; pass --prompts to make some")
    held = [s for s in sequences if is_held_out(s.prompt_id, args.eval_fraction)]
    train = [s for s in sequences if not is_held_out(s.prompt_id, args.eval_fraction)]
    report.update(n_sequences=len(sequences), n_train_sequences=len(train), n_held_out_sequences=len(held))

    # 2. The kept vocabulary (fixed once per work dir, so a resumed run trains the same head).
    # --init-from: a trained head's vocabulary and shape, and its weights as the start.
    vocab_path = work / "vocab.npy"
    t1 = time.time()
    start, start_target = load_head(args.init_from) if args.init_from else (None, None)
    if start is not None:
        from ..head.eagle import EagleHead

        start_arch = "eagle" if isinstance(start, EagleHead) else "redrafter"
        if given_arch is not None and given_arch != start_arch:
            raise ValueError(f"{args.init_from} is a head of kind {start_arch}, not --arch {given_arch}")
        args.arch = start_arch
        vocab = start.vocab.numpy()
        if vocab_path.exists() and not np.array_equal(np.load(vocab_path), vocab):
            raise ValueError(f"{work} holds a run with another kept vocabulary than {args.init_from}; "
                             f"use another --work-dir")
        np.save(vocab_path, vocab)
    elif vocab_path.exists():
        vocab = np.load(vocab_path)
    else:
        vocab = kept_vocabulary(train, args.kept_vocab, _target_vocab_size(target))
        np.save(vocab_path, vocab)
    weights = read_target(target, vocab)
    if start_target is not None and (start_target.n_embd, start_target.n_vocab, start_target.vocab_hash) != (
            weights.info.n_embd, weights.info.n_vocab, weights.info.vocab_hash):
        raise ValueError(f"{args.init_from} was trained for another target ({start_target.name}: width "
                         f"{start_target.n_embd}, {start_target.n_vocab} tokens), not {target}")
    n_vocab = weights.info.n_vocab
    report["kept_vocab"] = int(len(vocab))
    report["coverage_train"] = round(coverage(train, vocab), 4)
    if held:
        report["coverage_held_out"] = round(coverage(held, vocab), 4)
    column_of = np.full(n_vocab, -1, dtype=np.int64)
    column_of[vocab] = np.arange(len(vocab))

    # 3. Train (resumable) and export.
    # The engine's EAGLE-class head has no attention: each row drafts on its own, so its training
    # batches are rows drawn from all sequences (windows of one row), which trained it better than
    # windows of consecutive rows (docs/results-heads.md).
    batch_size = args.batch_size or (256 if args.arch == "eagle" else 128)
    config = TrainConfig(depth=args.depth, epochs=args.epochs, batch_size=batch_size, lr=args.lr,
                         eval_fraction=args.eval_fraction, eval_every=args.eval_every, threads=args.train_threads,
                         bf16=args.bf16)
    torch.manual_seed(config.seed)
    train_kwargs: dict[str, Any] = {}
    if args.arch == "eagle":
        from ..head.eagle import EagleConfig, EagleHead
        from ..head.eagle_train import build_windows, evaluate_windows, window_loss
        eagle_config = (start.config if start is not None else
                        EagleConfig(n_embd=weights.info.n_embd, n_target_vocab=n_vocab, n_ff=args.ff, attention=False))
        head = EagleHead(eagle_config, torch.from_numpy(vocab), torch.from_numpy(weights.embedding),
                         None if weights.output is None else torch.from_numpy(weights.output))
        if start is not None:  # the frozen rows from the target itself, the trained weights from the head
            head.load_state_dict({k: v for k, v in start.state_dict().items()
                                  if k in dict(head.named_parameters())}, strict=False)
            report["init_from"] = str(args.init_from)
        feature_weight = args.feature_weight

        def loss_fn(h: Any, w: Any, idx: Any) -> Any:
            return window_loss(h, w, idx, feature_weight)

        def examples(seqs: list[Any], depth: int) -> Any:
            # Without attention rows are drafted on their own: no window padded to the longest.
            return build_windows(seqs, column_of, depth, None if eagle_config.attention else 1)
        train_ex = build_windows(train, column_of, config.depth, args.window)
        train_kwargs = {"loss_fn": loss_fn, "eval_fn": evaluate_windows,
                        "settings": {"arch": "eagle", "ff": eagle_config.n_ff, "window": args.window,
                                     "feature_weight": feature_weight}}
    else:
        if start is None:
            head = new_head(weights, vocab, n_res_layers=args.res_layers, share_output=not args.own_output)
        else:  # the frozen rows from the target itself, the trained weights from the head
            head = new_head(weights, vocab, n_res_layers=start.config.n_res_layers,
                            share_output=start.config.share_output)
            trainable = dict(head.named_parameters())
            head.load_state_dict({k: v for k, v in start.state_dict().items() if k in trainable}, strict=False)
            report["init_from"] = str(args.init_from)

        def examples(seqs: list[Any], depth: int) -> Any:
            return build_examples(seqs, column_of, depth)
        train_ex = build_examples(train, column_of, config.depth)
    held_ex = examples(held, config.depth) if held else None
    # The held-out target answers apart, when the held-out set also has reference texts.
    answers = [s for s in held if s.source == "target"]
    answers_ex = examples(answers, config.depth) if answers and len(answers) < len(held) else None
    report.update(arch=args.arch, n_train_examples=train_ex.n, n_held_out_examples=held_ex.n if held_ex else 0,
                  n_held_out_answer_examples=answers_ex.n if answers_ex else None,
                  trainable_parameters=sum(p.numel() for p in head.parameters() if p.requires_grad))
    bar = _progress("train")

    def on_step(step: int, total: int, loss: float) -> None:
        bar.total = total
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.3f}")

    def on_eval(step: int, entry: dict[str, Any]) -> None:
        if "acc" in entry:
            bar.write(f"step {step}: held-out loss {entry['loss']:.3f}, acc@1..{config.depth} {entry['acc']}, "
                      f"chain@1..{config.depth} {entry['chain']}", file=sys.stderr)
        if "answers" in entry:
            a = entry["answers"]
            bar.write(f"  of it the target's own answers: loss {a['loss']:.3f}, acc@1..{config.depth} {a['acc']}, "
                      f"chain@1..{config.depth} {a['chain']}", file=sys.stderr)

    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    state = train_head(head, train_ex, held_ex, config, work, on_step=on_step, on_eval=on_eval, max_seconds=left,
                       held_out_answers=answers_ex, **train_kwargs)
    bar.close()
    report["train_seconds"] = round(time.time() - t1, 1)
    report["history"] = state.history
    report.update(step=state.step, total_steps=state.total, finished=state.finished)
    if state.finished:
        export_head(head, weights.info, out, dtype=args.dtype)
        report["head_bytes"] = out.stat().st_size
        if args.remember:
            from ..head.known import remember_head

            remember_head(target, out)  # Engine(target) and auto use it from now on
        report["remembered"] = bool(args.remember)
    write_report(work / "report.json", report)
    return report


def _target_vocab_size(target: str) -> int:
    import gguf

    reader = gguf.GGUFReader(target)
    return int(len(reader.fields["tokenizer.ggml.tokens"].data))


def _cmd_train_head(args: argparse.Namespace) -> int:
    report = run_train_head(args)
    if args.json:
        print(json.dumps(report))
    elif not report["finished"] and report["total_steps"] is None:
        print(f"stopped making data (--time-budget): {report['data_made']} sequences made now, "
              f"{report['data_planned']} planned; run the same command again to continue")
    elif not report["finished"]:
        print(f"stopped at step {report['step']} of {report['total_steps']} (--time-budget); the checkpoint is in "
              f"the work directory: run the same command again to continue")
    else:
        last = report["history"][-1] if report["history"] else {}
        print(f"head written to {report['out']} ({report['head_bytes'] / 1e6:.1f} MB); kept vocabulary "
              f"{report['kept_vocab']} (covers {report.get('coverage_held_out', report['coverage_train']):.1%} of "
              f"held-out answer tokens); held-out acc@k {last.get('acc')}, chain@k {last.get('chain')}"
              + (f" (the target's own answers: acc@k {last['answers']['acc']}, chain@k {last['answers']['chain']})"
                 if "answers" in last else "")
              + f"; data {report['data_seconds']:.0f} s, training {report['train_seconds']:.0f} s"
              + ("; engines of this target now load it by default (--no-head: none)" if report.get("remembered") else ""))
    return 0


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def register(subparsers: Any) -> None:
    from .options import add_engine_options

    p = subparsers.add_parser(
        "train-head", help="train a draft head for a target (method redrafter)",
        description="Makes training data with the target (its answers to --prompts, hidden states and "
                    "top-32 distributions; missing sequences only), trains a draft head on it (ReDrafter's recurrent "
                    "head or an EAGLE-class one, --arch) "
                    "(resumable: checkpoints in --work-dir), evaluates it on held-out prompts and writes "
                    "the head GGUF. Needs PyTorch.")
    p.add_argument("--target", default=None, help="GGUF path or registry name (default: the registry's default target)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a tested recipe: eagle = an EAGLE-class head from teacher-forced reference answers "
                        f"({', '.join(PRESETS['eagle']['prompts'])}; kept vocabulary 16384, 4 steps, 3 epochs, "
                        "bfloat16 where the CPU has it): about 80 minutes on 2 cores for the 1.5B target. Options "
                        "given with it override its settings")
    p.add_argument("--data", required=True, help="directory of training sequences (made / extended here)")
    p.add_argument("--out", required=True, help="head GGUF to write")
    p.add_argument("--prompts", action="append", default=None,
                   help=f"prompt slice SUITE[START:STOP] to make data from (repeatable; default none: use "
                        f"--data as it is). E.g. {' '.join('--prompts ' + s for s in DEFAULT_PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=128, help="answer length per sequence (default 128)")
    p.add_argument("--temperatures", type=_floats, default=(0.0, 0.8),
                   help="decoding of the answers: 0 greedy, > 0 sampled (default 0,0.8)")
    p.add_argument("--reference", action="store_true", default=None,
                   help="teacher forcing: evaluate each prompt's reference answer (HumanEval, GSM8K, ShareGPT) "
                        "instead of generating one (one batched pass, no decoding); prompts without one are "
                        "answered by the target")
    p.add_argument("--reference-max-tokens", type=int, default=384,
                   help="reference answers cut to this many tokens (default 384)")
    p.add_argument("--sampled-every", type=int, default=3, help="sampled answers for every N-th prompt (default 3)")
    p.add_argument("--kept-vocab", type=int, default=None, help=f"tokens the head predicts (default {BUILTIN['kept_vocab']})")
    p.add_argument("--arch", choices=["redrafter", "eagle"], default=None,
                   help="redrafter: the recurrent head; eagle: an EAGLE-class head (feature prediction through "
                        "one decoder layer's MLP, trained on its own predicted features) (default redrafter)")
    p.add_argument("--res-layers", type=int, default=1, help="redrafter: ResNet layers (default 1)")
    p.add_argument("--ff", type=int, default=4096, help="eagle: MLP width (default 4096)")
    p.add_argument("--window", type=int, default=1,
                   help="eagle: consecutive rows per training window (default 1: rows drawn from all sequences)")
    p.add_argument("--feature-weight", type=float, default=0.1,
                   help="eagle: weight of the predicted feature's distance to the target's (default 0.1)")
    p.add_argument("--own-output", action="store_true",
                   help="train an output matrix of its own instead of sharing the target's (frozen)")
    p.add_argument("--depth", type=int, default=None, help=f"draft steps trained (default {BUILTIN['depth']})")
    p.add_argument("--epochs", type=float, default=None, help=f"passes over the training rows (default {BUILTIN['epochs']:g})")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows (redrafter, default 128) or windows of --window rows (eagle, default 256) per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-fraction", type=float, default=0.08, help="share of prompts held out (default 0.08)")
    p.add_argument("--eval-every", type=int, default=None, help=f"steps between held-out evaluations (default {BUILTIN['eval_every']})")
    p.add_argument("--dtype", choices=["f32", "f16", "q8_0"], default="q8_0", help="matrix type in the GGUF")
    p.add_argument("--work-dir", default=None, help="checkpoints, kept vocabulary, report (default OUT.work)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="stop after this many seconds, data and training together: before the next sequence "
                        "while making data, with a checkpoint while training (run the same command again to "
                        "continue)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads for the data")
    add_engine_options(p)
    p.add_argument("--train-threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--init-from", default=None, metavar="HEAD.gguf",
                   help="start from this head's weights (its kind, kept vocabulary and shape: ResNet layers and "
                        "output form, or MLP width; --kept-vocab, --res-layers, --own-output, --ff are then ignored, "
                        "and --arch, if given, must name its kind): fine-tuning on new data")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="train with bfloat16 matrix products (torch autocast): 1.4-1.5x the steps per second on "
                        "CPUs with bfloat16 units (AVX512-BF16, AMX), slower on others; held-out evaluation stays "
                        "float32 (default off; --preset: on where the CPU has them)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--remember", action=argparse.BooleanOptionalAction, default=True,
                   help="make the written head the one an engine of this target loads by default, so that auto "
                        "weighs it without --head (default; --no-remember: write the file only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_cmd_train_head)
