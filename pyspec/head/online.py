"""Online fine-tuning of the engine's draft head, through the same loop as the draft model
(pyspec.online.OnlineDistiller: replay buffer, updates in a training process, hot reload).

    engine = pyspec.Engine(target, head="head.gguf", n_threads=1)
    distiller = HeadDistiller(engine, DistillConfig(lr=1e-4, positions="all", train_threads=1))
    for prompt in stream:
        distiller.generate(prompt, max_tokens=128)   # method "redrafter" unless told otherwise
    distiller.close()

What differs from the draft model: each observed generation is evaluated once more by the target
with hidden states on (`Engine.evaluate_hidden`, under the engine lock: one batched target pass
per request, which also gives the teacher's rows for positions="all" with teacher "evaluate"),
so that every training row r carries the hidden state the head drafts tokens[r + 1] from (the
state of row r - 1, after which tokens[r] was committed). The training process trains
`HeadDraft`: the head's first draft step at those rows (the deeper steps are trained offline by
`pyspec train-head`), exported as a head GGUF and installed with `Engine.reload_head`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import GenerationConfig
from ..engine import Engine, Prompt
from ..online.buffer import TraceSample, samples_from_result
from ..online.config import DistillConfig
from ..online.distiller import OnlineDistiller
from ..results import GenerationResult

HEAD_FACTORY = "pyspec.head.online:HeadDraft"

# The head predicts its kept vocabulary only; every other token gets this log-probability below
# the kept tokens' total (a constant, so no gradient), which keeps the losses finite.
OTHER_TOKENS_LOG_GAP = 30.0


class HeadDraft:
    """A head GGUF as a pyspec.online Distillable (trainer.Distillable): `module` is the
    RecurrentHead or EagleHead, `row_logits` its first draft step at a sample's rows as
    full-vocabulary logits, `step_logits` its steps 1..config.head_depth (an EAGLE-class head;
    the recurrent head's first step only), `export` a head GGUF (q8_0 unless config.export_dtype
    names f32 or f16)."""

    suffix = ".gguf"

    def __init__(self, path: str, config: DistillConfig) -> None:
        from .gguf_io import load_head

        self.module, self.info = load_head(path)
        self.dtype = config.export_dtype if config.export_dtype in ("f32", "f16", "q8_0") else "q8_0"
        self.depth = config.head_depth

    def vocab_parameters(self) -> list:  # -> list[torch.nn.Parameter]
        """The head's own output matrix (config.train_vocab=False freezes it); a head sharing the
        target's output and its embedding (every EAGLE-class head does) holds them as buffers,
        never trained."""
        from .model import RecurrentHead

        head = self.module
        return [head.output_weight] if isinstance(head, RecurrentHead) and not head.config.share_output else []

    def row_logits(self, sample: TraceSample):  # -> torch.Tensor [n_rows, n_vocab]
        import torch

        from .eagle import EagleHead

        if sample.hidden is None:
            raise ValueError("a draft head trains on samples with hidden states (HeadDistiller makes them)")
        head = self.module
        x = torch.from_numpy(np.asarray(sample.hidden, dtype=np.float32))
        g0 = torch.from_numpy(sample.tokens[sample.rows].astype(np.int64))
        if isinstance(head, EagleHead):  # its first step: the row's feature and the token it chose
            kept = head(x[:, None], g0[:, None, None], 1)[0][:, 0, 0]       # [n, V']
        else:
            kept, _ = head.step(x, torch.zeros_like(x), head.row_of[g0])   # [n, V']
        return self._full(kept)

    def step_logits(self, sample: TraceSample) -> list:  # -> [(torch.Tensor [n_k, n_vocab], np.ndarray [n_k])]
        """Steps 1..depth of the head at the sample's rows, each with the sample rows whose target
        distributions it learns. Row r's step k starts from tokens[r + k - 1] and the head's
        feature after step k - 1 (step 1: the hidden state of row r - 1) and drafts tokens[r + k],
        whose target distribution is that of row r + k - 1: step k is trained at the rows r for
        which rows r .. r + k - 1 are all in the sample."""
        import torch

        from .eagle import EagleHead

        head = self.module
        if self.depth == 1 or not isinstance(head, EagleHead):
            return [(self.row_logits(sample), None)]
        if sample.hidden is None:
            raise ValueError("a draft head trains on samples with hidden states (HeadDistiller makes them)")
        rows = sample.rows.astype(np.int64)
        n, depth = rows.shape[0], self.depth
        valid = np.ones((n, depth), dtype=bool)
        tokens = np.zeros((n, depth), dtype=np.int64)
        for k in range(depth):
            present = np.isin(rows + k, rows)
            valid[:, k] = present if k == 0 else valid[:, k - 1] & present
            tokens[valid[:, k], k] = sample.tokens[rows[valid[:, k]] + k]  # others: padding, never read back
        x = torch.from_numpy(np.asarray(sample.hidden, dtype=np.float32))
        kept = head(x[:, None], torch.from_numpy(tokens)[:, None], depth)[0][:, 0]    # [n, depth, V']
        parts = []
        for k in range(depth):
            sel = np.flatnonzero(valid[:, k])
            if sel.size:
                parts.append((self._full(kept[torch.from_numpy(sel), k]), np.searchsorted(rows, rows[sel] + k)))
        return parts

    def _full(self, kept):  # [n, V'] kept-vocabulary logits -> [n, n_vocab]
        import torch

        head = self.module
        other = torch.logsumexp(kept, dim=-1, keepdim=True).detach() - OTHER_TOKENS_LOG_GAP
        full = other.expand(kept.shape[0], head.config.n_target_vocab).clone()
        return full.scatter(1, head.vocab.expand(kept.shape[0], -1), kept)

    def export(self, out: Path) -> Path:
        from .gguf_io import export_head

        return export_head(self.module, self.info, out, dtype=self.dtype)


class HeadDistiller(OnlineDistiller):
    """OnlineDistiller for the engine's draft head (see the module docstring); same arguments
    except `draft` (the head is one per engine) and `factory` (HeadDraft by default)."""

    def __init__(self, engine: Engine, config: DistillConfig | None = None, update_interval: int = 8,
                 buffer_limit: int = 4096, max_age: int | None = None, *, factory: str = HEAD_FACTORY,
                 **options: object) -> None:
        super().__init__(engine, config, update_interval, buffer_limit, max_age, factory=factory,
                         **options)  # type: ignore[arg-type]

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, *, domain: str = "",
                 **options: object) -> GenerationResult:
        cfg = (config or GenerationConfig()).replace(**options)
        if cfg.method is None:
            cfg = cfg.replace(method="redrafter")
        return super().generate(prompt, cfg, domain=domain)

    def _check_drafter(self) -> None:
        if self.engine.head_path is None:
            raise ValueError("the engine has no draft head to fine-tune; load one with Engine.reload_head "
                             "(pyspec train-head makes one)")

    def _serving_path(self) -> str:
        path = self.engine.head_path
        if path is None:
            raise ValueError("the engine's draft head was removed")
        return path

    def _reload(self, path: Path) -> int:
        return self.engine.reload_head(path)

    def _serving_version(self) -> int:
        return self.engine.head_version

    def _drafted_version(self, result: GenerationResult) -> int:
        return result.head_version

    def _describe(self) -> str:
        return "the draft head"

    def _sample(self, result: GenerationResult, index: int, domain: str) -> TraceSample | None:
        if not result.tokens:
            return None
        # One target pass over prompt + output: hidden states for the head, and the teacher's rows
        # when the config asks for them (positions "all", teacher "evaluate"); row i of the
        # output part predicts generated token i.
        sequence = list(result.prompt_tokens) + list(result.tokens[:-1])
        logits, hidden = self.engine.evaluate_hidden(sequence)
        cfg = self.config
        teacher = logits[len(result.prompt_tokens) - 1:] if cfg.positions == "all" and cfg.teacher == "evaluate" else None
        del logits
        sample = samples_from_result(result, positions=cfg.positions, top_k=cfg.top_k, teacher_logits=teacher,
                                     request=index, domain=domain)
        if sample is None:
            return None
        # Row r trains the step that drafts tokens[r + 1] from tokens[r] and the hidden state of
        # row r - 1; row 0 (a one-token prompt) has no such state and is left out.
        keep = sample.rows >= 1
        if not keep.any():
            return None
        rows = sample.rows[keep]
        return TraceSample(tokens=sample.tokens, rows=rows, top_ids=sample.top_ids[keep],
                           top_probs=sample.top_probs[keep], request=sample.request, domain=sample.domain,
                           hidden=hidden[rows - 1].astype(np.float16))
