"""Does one online update of the stream's draft learn, per learning rate and vocabulary setting?
(docs/results-online.md, "Freezing the vocabulary": at lr 5e-4 the frozen draft's loss on its own
batch rose.)

    python benchmarks/online_update_rates.py --draft qwen6.gguf --lrs 5e-5,1e-4,2e-4,5e-4 \
        --settings frozen,trained --data rates_samples.pkl --json rates.json

The samples are online_update_cost.py's (the same requests and update batch: --new requests
plus rehearsal drawn from --rehearsed earlier ones; held-out prompts), served once and kept in
--data (reused when the file exists). For each (setting, rate), from the draft's file, with a
fresh trainer (DraftTrainer: float32 master weights, fresh AdamW, the update's rate is --lr as
the first update of the stream uses it): the loss of the update's batch (new and rehearsed
samples separately) and of the held-out samples, measured before the update, after it on the
master weights, and after it on the exported draft (the file the engine would load, read back:
its weights rounded to the source's types), with every optimizer step's batch loss. Losses are
mean forward KL per position against the target's top-k plus tail bucket (the training loss).
Not timings: run under heavy, not quiet.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import online_update_cost as cost  # this script's directory is on sys.path

SETTINGS = cost.SETTINGS


def losses(student: Any, parts: dict[str, list[Any]], config: Any) -> dict[str, float]:
    import torch

    from pyspec.online.trainer import batch_loss

    with torch.no_grad():
        return {name: float(batch_loss(student, samples, config)) for name, samples in parts.items() if samples}


def run_one(args: argparse.Namespace, data: dict[str, Any], setting: str, lr: float) -> dict[str, Any]:
    from pyspec.online import load_gguf
    from pyspec.online.trainer import DraftTrainer

    config = cost.distill_config(argparse.Namespace(**{**vars(args), "lr": lr}), SETTINGS[setting])
    parts = {"new": data["samples"], "rehearsed": data["rehearsed"],
             **{f"heldout_{k}": v for k, v in data["heldout"].items()}}
    with tempfile.TemporaryDirectory(prefix="pyspec-update-rates-") as work_dir:
        trainer = DraftTrainer(args.draft, config, work_dir)
        before = losses(trainer.student, parts, config)
        path, report = trainer.update(data["samples"], data["rehearsed"])
        after_master = losses(trainer.student, parts, config)
        del trainer
        gc.collect()
        exported = load_gguf(path)
        after_export = losses(exported, parts, config)
        del exported
        gc.collect()
    return {"setting": setting, "train_vocab": SETTINGS[setting], "lr": report.lr, "n_steps": report.n_steps,
            "step_losses": list(report.step_losses), "report_loss_before": report.loss_before,
            "report_loss_after": report.loss_after, "before": before, "after_master": after_master,
            "after_export": after_export, "train_seconds": report.seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cost.add_update_arguments(p, sweep_rates=True)
    p.add_argument("--data", help="pickle of the served samples: read if it exists, else written")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    settings = args.settings.split(",")
    for name in settings:
        if name not in SETTINGS:
            p.error(f"--settings: unknown setting {name!r} (known: {', '.join(SETTINGS)})")
    lrs = [float(x) for x in args.lrs.split(",")]

    t0 = time.perf_counter()
    if args.data and Path(args.data).exists():
        with open(args.data, "rb") as f:
            data = pickle.load(f)
    else:
        served = cost.serve(args)
        samples, rehearsed = cost.update_batch(args, served)
        data = {"samples": samples, "rehearsed": rehearsed, "heldout": served["heldout"]}
        if args.data:
            with open(args.data, "wb") as f:
                pickle.dump(data, f)
    runs: list[dict[str, Any]] = []

    def summary() -> dict[str, Any]:
        return {"args": vars(args), "n_new_positions": sum(s.n_rows for s in data["samples"]),
                "n_rehearsed_positions": sum(s.n_rows for s in data["rehearsed"]),
                "heldout_positions": {k: sum(s.n_rows for s in v) for k, v in data["heldout"].items()},
                "runs": runs, "seconds": time.perf_counter() - t0}

    for setting in settings:
        for lr in lrs:
            run = run_one(args, data, setting, lr)
            runs.append(run)
            if args.json:  # after every run: a long sweep cut short keeps what it measured
                Path(args.json).write_text(json.dumps(summary(), indent=1) + "\n", encoding="utf-8")
            fmt = lambda d: ", ".join(f"{k} {v:.2f}" for k, v in d.items())  # noqa: E731
            print(f"{setting} lr {lr:g}: before [{fmt(run['before'])}]; master [{fmt(run['after_master'])}]; "
                  f"export [{fmt(run['after_export'])}]; steps {[round(x, 2) for x in run['step_losses']]}",
                  file=sys.stderr, flush=True)
    print(json.dumps(summary(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
