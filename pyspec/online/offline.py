"""Offline distillation of the draft (OSD §4.1, `pyspec distill`): the draft is trained on the
target's distributions at every position of sequences that come from

- "teacher": the target's own continuation of each prompt (Engine.generate(method="none",
  return_logits=True): the rows come with the generation);
- "student": the draft's continuation, decoded here with the PyTorch draft as it is being
  trained (on-policy; the target's rows then cost one Engine.evaluate(all_rows=True) pass);
- "mixed": per sequence, the teacher's with probability `mix`, else the student's (OSD mixes the
  two distributions; mixing whole sequences avoids a target call per token).

The student decodes without a KV cache (every token re-reads the whole sequence), which is fine
for the short continuations distillation uses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..engine import Engine
from .buffer import TraceSample, sample_from_rows
from .model import DraftModel
from .trainer import DistillConfig, make_optimizer, train_step

log = logging.getLogger("pyspec.online")

SAMPLINGS = ("teacher", "student", "mixed")


@dataclass(frozen=True)
class OfflineReport:
    losses: list[float]  # [steps] mean loss per position of each step's batch, before its update
    n_positions: int     # training positions over all steps
    sources: dict[str, int] = field(default_factory=dict)  # sequences by source: teacher / student
    seconds: float = 0.0


def student_continuation(model: DraftModel, engine: Engine, prompt_tokens: Sequence[int], max_tokens: int,
                         temperature: float = 0.0, generator: torch.Generator | None = None) -> list[int]:
    """The draft's own continuation of a prompt (greedy at temperature 0), up to max_tokens or an
    end-of-generation token (not included)."""
    sequence = list(prompt_tokens)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            hidden = model.hidden_states(torch.tensor(sequence, dtype=torch.long))[-1]
            logits = F.linear(hidden, model.output_weight)  # [n_vocab]
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            else:
                token = int(logits.argmax())
            if engine.is_eog(token):
                break
            out.append(token)
            sequence.append(token)
    return out


def distill_offline(engine: Engine, model: DraftModel, prompts: Sequence[Sequence[int]], config: DistillConfig, *,
                    steps: int, sampling: str = "teacher", max_tokens: int = 64, temperature: float = 0.0,
                    mix: float = 0.5, on_step: Callable[[int, float], None] | None = None) -> OfflineReport:
    """`steps` optimizer steps on `config.batch_size` prompts each (cycling through `prompts`,
    reshuffled every pass), every generated position trained against the target's top_k.

    config supplies loss, tau, beta, top_k, optimiser settings and train_threads (its positions
    and teacher fields do not apply here). temperature: of both the teacher's and the student's
    sampling (0: greedy; greedy teacher sequences are generated once per prompt and reused).
    """
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if steps < 1 or not prompts:
        raise ValueError(f"need steps >= 1 and at least one prompt, got steps={steps}, {len(prompts)} prompts")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    t0 = time.perf_counter()
    torch.set_num_threads(config.train_threads)
    rng = np.random.default_rng(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = make_optimizer(model, config)
    teacher_cache: dict[int, TraceSample | None] = {}
    sources = {"teacher": 0, "student": 0}

    def teacher_sample(i: int) -> TraceSample | None:
        if temperature == 0 and i in teacher_cache:
            return teacher_cache[i]
        result = engine.generate(list(prompts[i]), method="none", max_tokens=max_tokens, temperature=temperature,
                                 return_logits=True, trace_top_k=0, seed=int(rng.integers(1 << 31)))
        assert result.logits is not None
        sample = sample_from_rows(result.prompt_tokens, result.tokens, result.logits, top_k=config.top_k)
        teacher_cache[i] = sample
        return sample

    def student_sample(i: int) -> TraceSample | None:
        tokens = student_continuation(model, engine, prompts[i], max_tokens, temperature, generator)
        if not tokens:
            return None
        rows = engine.evaluate(list(prompts[i]) + tokens[:-1], all_rows=True, first_row=len(prompts[i]) - 1)
        return sample_from_rows(prompts[i], tokens, rows, top_k=config.top_k)

    order: list[int] = []
    losses: list[float] = []
    n_positions = 0
    for step in range(steps):
        batch: list[TraceSample] = []
        for _ in range(min(config.batch_size, len(prompts))):
            if not order:
                order = list(rng.permutation(len(prompts)))
            i = int(order.pop())
            use_teacher = sampling == "teacher" or (sampling == "mixed" and rng.random() < mix)
            sample = teacher_sample(i) if use_teacher else student_sample(i)
            sources["teacher" if use_teacher else "student"] += 1
            if sample is not None:
                batch.append(sample)
        loss = train_step(model, optimizer, batch, config) if batch else math.nan
        n_positions += sum(s.n_rows for s in batch)
        losses.append(loss)
        log.info("distill step %d/%d: loss %.4f on %d positions", step + 1, steps, loss,
                 sum(s.n_rows for s in batch))
        if on_step is not None:
            on_step(step, loss)
    return OfflineReport(losses=losses, n_positions=n_positions, sources=sources, seconds=time.perf_counter() - t0)
