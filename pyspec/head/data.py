"""Training data for a draft head, made by the target itself.

For each prompt the target generates an answer (greedy, or sampled at a temperature), then the
prompt + answer is evaluated once more from scratch with hidden states on
(`Engine.evaluate_top_k`): row j of that pass holds the target's last-layer hidden state after
token j (final norm applied) and its distribution of token j + 1. A head learns to predict the
answer's later tokens from those rows, so only the rows from the last prompt token on are kept:

- `tokens` [n_tokens] int32: prompt + answer;
- `first_row`: the index of the last prompt token (row first_row predicts the first answer token);
- `hidden` [n_rows, n_hidden] float16: hidden states of rows first_row .. n_tokens - 1;
- `top_ids` / `top_probs` [n_rows, top_k]: the target's top-k distribution (temperature 1) at
  those rows, the distillation target (the full row has n_vocab entries; the top 32 hold nearly
  all of the mass of this target's rows and cost 200 bytes instead of 600 KB).

Reference sequences (teacher forcing, SequenceSpec.source == "reference"): instead of the
target's own answer, the prompt's reference text (a HumanEval canonical solution in a code fence,
a GSM8K worked answer, a ShareGPT reply; `reference_answer`) is appended and evaluated in the
same single pass. No decoding is needed, so a sequence costs one batched evaluation instead of a
generation and an evaluation; the distillation targets are still the target's own distributions
at every row. Such a sequence also keeps the rows of the user's
message (from the end of the chat template's fixed preamble), which the target's distributions
label just as well.

One .npz file per sequence in a directory, written atomically, so an interrupted run resumes
where it stopped and a run with more prompts adds to an existing directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..errors import ContextOverflowError

if TYPE_CHECKING:
    from ..data import Prompt
    from ..engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SequenceSpec:
    """One training sequence to make: a prompt and how to answer it."""

    prompt_id: str
    temperature: float  # 0: greedy (source "target")
    seed: int
    source: str = "target"  # "target": the target's answer; "reference": the prompt's reference text

    @property
    def key(self) -> str:
        """File name stem: stable across runs, unique per (prompt, decoding)."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.prompt_id)
        if self.source == "reference":
            return f"{safe}__ref"
        return f"{safe}__t{self.temperature:g}__s{self.seed}"


@dataclass(frozen=True)
class DataConfig:
    max_tokens: int = 128
    top_k: int = 32             # stored distribution entries per row
    chat: bool = True           # prompts through the target's chat template
    reference_max_tokens: int = 384  # reference answers are cut to this many tokens


_GSM8K_CALC = re.compile(r"<<[^>]*>>")


def reference_answer(prompt: "Prompt") -> str | None:
    """The prompt's reference answer as assistant text, or None when its suite has none:
    HumanEval's canonical solution completing the prompt in a python code fence (the form the
    target answers in), GSM8K's worked answer without its calculator annotations, ShareGPT's first
    reply."""
    if prompt.suite == "humaneval" and "canonical_solution" in prompt.meta:
        return f"```python\n{prompt.text}{prompt.meta['canonical_solution'].rstrip()}\n```"
    if prompt.suite == "gsm8k" and prompt.meta.get("answer"):
        text = _GSM8K_CALC.sub("", prompt.meta["answer"])
        return re.sub(r"\n#### *(.+)$", r"\nThe answer is \1.", text.strip())
    if prompt.suite == "sharegpt" and prompt.meta.get("answer"):
        return str(prompt.meta["answer"])
    return None


@dataclass
class HeadSequence:
    """One stored sequence (see the module docstring for the fields)."""

    tokens: np.ndarray
    first_row: int
    hidden: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    prompt_id: str = ""
    temperature: float = 0.0
    source: str = "target"  # as SequenceSpec.source: the target's answer, or a reference text

    @property
    def n_rows(self) -> int:
        return int(self.hidden.shape[0])


def make_sequence(engine: "Engine", prompt_tokens: list[int], spec: SequenceSpec, config: DataConfig) -> HeadSequence:
    """Generates the target's answer and evaluates prompt + answer with hidden states."""
    # Plain decoding or auto (lookup and pool, no draft model) give the same tokens; auto is faster.
    result = engine.generate(prompt_tokens, method="auto", auto_draft_model=False, max_tokens=config.max_tokens,
                             temperature=spec.temperature, seed=spec.seed if spec.temperature > 0 else None,
                             trace_top_k=0)
    tokens = list(prompt_tokens) + list(result.tokens)
    first_row = len(prompt_tokens) - 1
    ids, probs, hidden = engine.evaluate_top_k(tokens, config.top_k, first_row=first_row)
    return HeadSequence(
        tokens=np.asarray(tokens, dtype=np.int32), first_row=first_row,
        hidden=hidden.astype(np.float16), top_ids=ids, top_probs=probs.astype(np.float16),
        prompt_id=spec.prompt_id, temperature=spec.temperature,
    )


def make_reference_sequence(engine: "Engine", prompt_tokens: list[int], answer: str, first_row: int,
                            spec: SequenceSpec, config: DataConfig) -> HeadSequence:
    """Teacher forcing: prompt + reference answer evaluated in one pass with hidden states; rows
    from `first_row` (the end of the chat template's preamble) on are kept."""
    answer_tokens = engine.tokenize(answer, add_special=False, parse_special=False)[: config.reference_max_tokens]
    tokens = list(prompt_tokens) + answer_tokens
    first_row = min(max(first_row, 0), len(prompt_tokens) - 1)
    ids, probs, hidden = engine.evaluate_top_k(tokens, config.top_k, first_row=first_row)
    return HeadSequence(
        tokens=np.asarray(tokens, dtype=np.int32), first_row=first_row,
        hidden=hidden.astype(np.float16), top_ids=ids, top_probs=probs.astype(np.float16),
        prompt_id=spec.prompt_id, temperature=0.0, source="reference",
    )


def template_preamble(engine: "Engine", chat: bool) -> int:
    """Tokens every prompt starts with (the chat template's system turn and the user turn's
    header): the common prefix of two rendered prompts."""
    if not chat:
        return 0
    a = engine.prompt_tokens([{"role": "user", "content": "a"}])
    b = engine.prompt_tokens([{"role": "user", "content": "7"}])
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def save_sequence(seq: HeadSequence, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, tokens=seq.tokens, first_row=np.int64(seq.first_row), hidden=seq.hidden,
             top_ids=seq.top_ids, top_probs=seq.top_probs, prompt_id=np.str_(seq.prompt_id),
             temperature=np.float32(seq.temperature), source=np.str_(seq.source))
    os.replace(tmp, path)


def load_sequence(path: Path) -> HeadSequence:
    with np.load(path) as f:
        # Files written before `source` was stored name reference sequences by their stem.
        source = str(f["source"]) if "source" in f else ("reference" if path.stem.endswith("__ref") else "target")
        return HeadSequence(tokens=f["tokens"], first_row=int(f["first_row"]), hidden=f["hidden"],
                            top_ids=f["top_ids"], top_probs=f["top_probs"], prompt_id=str(f["prompt_id"]),
                            temperature=float(f["temperature"]), source=source)


def iter_sequences(data_dir: str | os.PathLike[str]) -> Iterator[HeadSequence]:
    for path in sorted(Path(data_dir).glob("*.npz")):
        if not path.name.endswith(".tmp.npz"):
            yield load_sequence(path)


def plan_sequences(prompts: Sequence["Prompt"], temperatures: Sequence[float], sampled_every: int = 1,
                   reference: bool = False) -> list[tuple["Prompt", SequenceSpec]]:
    """Greedy (temperature 0) answers for every prompt, sampled ones (each temperature > 0) for
    about one prompt in `sampled_every`. Which prompts, and the seeds, are functions of the prompt
    id alone (prompt_seed), not of its place in the list: a plan over more prompts, or over the
    same prompts in another order, names the same sequences, so its data is reused.
    reference: a teacher-forced sequence of the reference answer instead, for every prompt that
    has one (prompts without one get the target's answers as above)."""
    plan = []
    for prompt in prompts:
        if reference and reference_answer(prompt) is not None:
            plan.append((prompt, SequenceSpec(prompt.id, 0.0, seed=0, source="reference")))
            continue
        seed = prompt_seed(prompt.id)
        for t in temperatures:
            if t == 0.0 or seed % sampled_every == 0:
                plan.append((prompt, SequenceSpec(prompt.id, float(t), seed=seed)))
    return plan


def prompt_seed(prompt_id: str) -> int:
    """A stable seed per prompt id (CRC-32, the same in every process and version)."""
    return zlib.crc32(prompt_id.encode("utf-8"))


def make_training_data(
    engine: "Engine",
    plan: Sequence[tuple["Prompt", SequenceSpec]],
    out_dir: str | os.PathLike[str],
    config: DataConfig = DataConfig(),
    *,
    on_sequence: Callable[[int, int], None] | None = None,
    deadline: float | None = None,
) -> tuple[int, bool]:
    """Writes one file per planned sequence into out_dir, skipping those already there.

    Returns the number of sequences made now and whether the plan is complete: with `deadline`
    (a time.monotonic() value) no sequence but the first is started after it (every call makes
    progress), and a later call with the same plan makes the rest. on_sequence(done, total) reports progress.
    The directory records the target and settings in meta.json; a directory made for another
    target or with other settings is refused (ValueError) rather than mixed.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target": os.path.basename(engine.target_path), "n_vocab": engine.n_vocab, "config": asdict(config)}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        # Directories made before reference answers existed hold none: any cut is compatible.
        old.get("config", {}).setdefault("reference_max_tokens", config.reference_max_tokens)
        if old != json.loads(json.dumps(meta)):
            raise ValueError(f"{out} holds data made with other settings: {old} (now {meta})")
    else:
        meta_path.write_text(json.dumps(meta, indent=1))
    made = 0
    preamble: int | None = None
    for done, (prompt, spec) in enumerate(plan):
        path = out / f"{spec.key}.npz"
        if not path.exists():
            if made > 0 and deadline is not None and time.monotonic() > deadline:
                return made, False
            tokens = engine.prompt_tokens(prompt.render(config.chat))
            try:
                if spec.source == "reference":
                    answer = reference_answer(prompt)
                    if answer is None:
                        raise ValueError(f"prompt {prompt.id} has no reference answer")
                    if preamble is None:
                        preamble = template_preamble(engine, config.chat)
                    seq = make_reference_sequence(engine, tokens, answer, preamble - 1, spec, config)
                else:
                    seq = make_sequence(engine, tokens, spec, config)
            except ContextOverflowError as e:
                # One long conversation must not end a run of thousands: it is left out, said once.
                log.warning("skipping %s: %s", prompt.id, e)
            else:
                save_sequence(seq, path)
                made += 1
        if on_sequence:
            on_sequence(done + 1, len(plan))
    return made, True
