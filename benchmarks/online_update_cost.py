"""What one online update costs, with the draft's vocabulary matrices trained and frozen
(DistillConfig.train_vocab), against the time the requests it follows took to serve
(an update must finish before the next I requests are served, or learning falls behind traffic).

    python benchmarks/online_update_cost.py --draft qwen6.gguf --json update_cost.json

One run, side by side: the engine (target + draft, method chain, greedy, the chat template)
serves --rehearsed earlier requests, then --new requests (timed: the serving time an update must
beat), then the held-out prompts; each generation keeps the target's rows (return_logits, as
the online distiller does for positions="all"). The update is the one the stream's distiller
would make after those requests: the --new samples plus rehearsal (config.rehearsal x their
positions drawn from the earlier samples, through the same ReplayBuffer). It then runs once
per setting, each in a fresh training process (this script again, `--child`) that loads the
draft as the online trainer does (DraftTrainer), measures the held-out loss, times
DraftTrainer.update (training + export in the source's types), measures the held-out loss and
the update batch's loss again (both also before the update: the report's loss_before is not the
loss before the update but the first epoch's running mean) and reports its peak resident
memory: after loading (VmHWM), and over the update alone (VmHWM reset through
/proc/self/clear_refs after loading). Engine and training never run at once here; in the
stream they share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from online_stream import peak_rss_mb  # this script's directory is on sys.path

SETTINGS = {"trained": True, "frozen": False}  # name -> DistillConfig.train_vocab


def reset_peak_rss() -> bool:
    """Starts VmHWM again from the current RSS (Linux: writing 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def distill_config(args: argparse.Namespace, train_vocab: bool) -> Any:
    from pyspec.online import DistillConfig

    return DistillConfig(loss=args.loss, positions="all", top_k=args.top_k, lr=args.lr, lr_schedule=args.lr_schedule,
                         epochs=args.epochs, batch_size=args.batch_size, rehearsal=args.rehearsal,
                         train_vocab=train_vocab, train_threads=args.train_threads, export_dtype=args.export_dtype)


def load_prompts(suite: str, start: int, n: int) -> list[str]:
    from pyspec.data import load_suite

    return [p.render(chat=True) for p in load_suite(suite, start + n)[start:]]


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """Generates every sample; returns them with the serving times."""
    import pyspec
    from pyspec.online import samples_from_result

    earlier = load_prompts(args.train_suite, 0, args.rehearsed)
    new = load_prompts(args.train_suite, args.rehearsed, args.new)
    heldout: dict[str, list[str]] = {}
    for part in args.heldout.split(","):
        name, _, n = part.partition(":")
        start = args.rehearsed + args.new if name == args.train_suite else 0
        heldout[name] = load_prompts(name, start, int(n))
    options = dict(max_tokens=args.max_tokens, method="chain", n_draft=args.n_draft, return_logits=True)

    def run(engine: Any, prompts: list[str]) -> tuple[list[Any], list[float], int, int]:
        samples, seconds, drafted, accepted = [], [], 0, 0
        for prompt in prompts:
            t0 = time.perf_counter()
            result = engine.generate(prompt, **options)
            seconds.append(time.perf_counter() - t0)
            drafted += result.stats.n_drafted
            accepted += result.stats.n_accepted
            sample = samples_from_result(result, positions="all", top_k=args.top_k)
            if sample is not None:
                samples.append(sample)
        return samples, seconds, drafted, accepted

    with pyspec.Engine(args.target, draft=args.draft, n_ctx=args.n_ctx, n_threads=args.threads) as engine:
        earlier_samples, _, _, _ = run(engine, earlier)
        new_samples, new_seconds, drafted, accepted = run(engine, new)
        heldout_samples = {name: run(engine, prompts)[0] for name, prompts in heldout.items()}
    return {"earlier": earlier_samples, "new": new_samples, "heldout": heldout_samples,
            "serve_seconds": new_seconds, "new_acceptance": accepted / drafted if drafted else None}


def update_batch(args: argparse.Namespace, data: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The samples the distiller's update would train on: the new ones, and rehearsal drawn from
    the earlier ones through the distiller's ReplayBuffer."""
    from pyspec.online.buffer import ReplayBuffer

    buffer = ReplayBuffer(1 << 20, rehearsal_limit=16384, seed=0)
    for sample in data["earlier"]:
        buffer.add(sample)
    buffer.release(buffer.snapshot())
    n_new = sum(s.n_rows for s in data["new"])
    return data["new"], buffer.rehearsal(int(args.rehearsal * n_new)) if args.rehearsal > 0 else []


def child(args: argparse.Namespace) -> None:
    """One setting in this (fresh) process: held-out loss, update, held-out loss, memory."""
    import torch

    from pyspec.online.trainer import DraftTrainer, batch_loss

    with open(args.child_data, "rb") as f:
        data = pickle.load(f)
    config = distill_config(args, SETTINGS[args.child])

    def heldout_loss(trainer: DraftTrainer) -> dict[str, float]:
        with torch.no_grad():
            return {name: float(batch_loss(trainer.student, samples, config))
                    for name, samples in data["heldout"].items()}

    def own_loss(trainer: DraftTrainer) -> float:
        """The update's batch (new and rehearsed samples), measured as a whole: the report's
        loss_before is the first epoch's running mean, taken while the weights move."""
        with torch.no_grad():
            return float(batch_loss(trainer.student, [*data["samples"], *data["rehearsed"]], config))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyspec-update-cost-") as work_dir:
        trainer = DraftTrainer(args.draft, config, work_dir)
        load_seconds = time.perf_counter() - t0
        before = heldout_loss(trainer)
        own_before = own_loss(trainer)
        load_peak = peak_rss_mb()
        reset = reset_peak_rss()
        t0 = time.perf_counter()
        path, report = trainer.update(data["samples"], data["rehearsed"])
        update_seconds = time.perf_counter() - t0
        update_peak = peak_rss_mb() if reset else None
        after = heldout_loss(trainer)
        own_after = own_loss(trainer)
        n_params = sum(p.numel() for p in trainer.student.module.parameters())
        n_trained = sum(p.numel() for group in trainer.optimizer.param_groups for p in group["params"])
        out_bytes = path.stat().st_size
    json.dump({
        "setting": args.child, "train_vocab": config.train_vocab, "load_seconds": load_seconds,
        "update_seconds": update_seconds, "train_seconds": report.seconds, "export_seconds": report.export_seconds,
        "n_steps": report.n_steps, "n_positions": report.n_positions, "n_rehearsed": report.n_rehearsed,
        "train_loss_before": report.loss_before, "train_loss_after": report.loss_after,
        "batch_loss_before": own_before, "batch_loss_after": own_after, "step_losses": list(report.step_losses),
        "heldout_loss_before": before, "heldout_loss_after": after,
        "peak_rss_mb_after_load": load_peak, "peak_rss_mb_update": update_peak,
        "n_parameters": n_params, "n_trained_parameters": n_trained, "export_bytes": out_bytes,
    }, sys.stdout)


def add_update_arguments(p: argparse.ArgumentParser, sweep_rates: bool = False) -> None:
    """The served requests, the update batch and the trainer's settings: the arguments this script
    shares with online_update_rates.py, which takes --lrs (a comma-separated sweep) in place of --lr."""
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", required=True, help="the draft GGUF (the stream's: qwen6.gguf)")
    p.add_argument("--train-suite", default="humaneval", help="suite of the served (training) requests")
    p.add_argument("--new", type=int, default=8, help="requests the update follows (the update interval)")
    p.add_argument("--rehearsed", type=int, default=4, help="earlier requests, the rehearsal reservoir")
    p.add_argument("--heldout", default="humaneval:4,mtbench:4",
                   help="held-out prompts per suite (the training suite's come after its served ones)")
    p.add_argument("--settings", default="frozen,trained", help="order of the training runs")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--n-draft", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="engine threads")
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--loss", default="fkl")
    p.add_argument("--top-k", type=int, default=32)
    if sweep_rates:
        p.add_argument("--lrs", default="5e-5,1e-4,2e-4,5e-4", help="learning rates, comma-separated")
    else:
        p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--lr-schedule", default="inverse_sqrt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--rehearsal", type=float, default=0.5)
    p.add_argument("--train-threads", type=int, default=1)
    p.add_argument("--export-dtype", default="source")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_update_arguments(p)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    p.add_argument("--child-data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0

    settings = args.settings.split(",")
    for name in settings:
        if name not in SETTINGS:
            p.error(f"--settings: unknown setting {name!r} (known: {', '.join(SETTINGS)})")
    t0 = time.perf_counter()
    data = serve(args)
    samples, rehearsed = update_batch(args, data)
    serve_seconds = sum(data["serve_seconds"])
    print(f"served {len(data['serve_seconds'])} requests in {serve_seconds:.1f} s "
          f"(acceptance {data['new_acceptance']:.3f}); update: {sum(s.n_rows for s in samples)} new + "
          f"{sum(s.n_rows for s in rehearsed)} rehearsed positions", file=sys.stderr)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pyspec-update-cost-") as tmp:
        data_path = Path(tmp) / "samples.pkl"
        with open(data_path, "wb") as f:
            pickle.dump({"samples": samples, "rehearsed": rehearsed, "heldout": data["heldout"]}, f)
        child_args = argv if argv is not None else sys.argv[1:]  # the child returns before --json
        for name in settings:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *child_args, "--child", name,
                                  "--child-data", str(data_path)], check=True, stdout=subprocess.PIPE, text=True)
            run = json.loads(out.stdout)
            run["update_over_serving"] = run["update_seconds"] / serve_seconds
            runs[name] = run
            print(f"{name}: update {run['update_seconds']:.1f} s (train {run['train_seconds']:.1f}, export "
                  f"{run['export_seconds']:.1f}) = {run['update_over_serving']:.2f}x serving; peak RSS "
                  f"{run['peak_rss_mb_update']} MB during the update; own batch loss {run['batch_loss_before']:.2f} -> "
                  f"{run['batch_loss_after']:.2f}; held-out loss "
                  f"{run['heldout_loss_before']} -> {run['heldout_loss_after']}", file=sys.stderr)
    summary = {"args": vars(args), "serve_seconds": serve_seconds, "serve_seconds_each": data["serve_seconds"],
               "new_acceptance": data["new_acceptance"],
               "n_new_positions": sum(s.n_rows for s in samples),
               "n_rehearsed_positions": sum(s.n_rows for s in rehearsed),
               "heldout_positions": {k: sum(s.n_rows for s in v) for k, v in data["heldout"].items()},
               "runs": runs, "seconds": time.perf_counter() - t0}
    text = json.dumps(summary, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
