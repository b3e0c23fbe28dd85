"""DistillConfig(train_vocab=False): the draft's vocabulary matrices (token embedding, output
matrix tied or not) are frozen. An update leaves them bit-identical, moves every other tensor,
gives them no AdamW state, and the exported GGUF carries the source's bytes for them (also when
the export re-quantizes the rest to the source's K-quant mix). DistillConfig(train_blocks=N)
freezes every block but the last N the same way."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import pyspec
from online_golden import quantize_with_llama_cpp
from pyspec._models.tiny import build_tiny_model
from pyspec.online import DistillConfig, TraceSample, open_gguf, samples_from_result
from pyspec.online.trainer import DraftTrainer, batch_loss, make_optimizer, trainable_parameters

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "import numpy as np"]
VOCAB = ("token_embd.weight", "output.weight")


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("online_freeze")
    wide = build_tiny_model(folder / "wide.gguf", seed=5, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    return {
        "llama": build_tiny_model(folder / "llama.gguf", seed=31, base_seed=0, perturb=0.3),
        "qwen2-tied": build_tiny_model(folder / "qwen2-tied.gguf", seed=32, arch="qwen2", tied_output=True),
        "q4_k_m": quantize_with_llama_cpp(wide, folder / "wide-q4km.gguf", "Q4_K_M"),
    }


@pytest.fixture(scope="module")
def samples(tiny_target: str) -> list[TraceSample]:
    """Every generated position of the tiny target's greedy outputs, with its full rows."""
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as engine:
        results = [engine.generate(p, max_tokens=24, method="none", return_logits=True) for p in PROMPTS]
    made = [samples_from_result(r, positions="all", top_k=8) for r in results]
    return [s for s in made if s is not None]


def source_bytes(path: Path) -> dict[str, bytes]:
    return {t.name: np.asarray(t.data).tobytes() for t in open_gguf(path).tensors}


@pytest.mark.parametrize("variant", ["llama", "qwen2-tied", "q4_k_m"])
@pytest.mark.parametrize("train_vocab", [False, True])
def test_an_update_moves_only_what_is_trained(drafts: dict[str, Path], samples: list[TraceSample], tmp_path: Path,
                                              variant: str, train_vocab: bool) -> None:
    config = DistillConfig(lr=1e-3, epochs=2, batch_size=2, positions="all", train_vocab=train_vocab)
    trainer = DraftTrainer(drafts[variant], config, tmp_path)
    model = trainer.student.module
    tensors = model.gguf_tensors()
    vocab = [name for name in VOCAB if name in tensors]
    assert vocab == (["token_embd.weight"] if variant == "qwen2-tied" else list(VOCAB))
    before = {name: p.detach().clone() for name, p in tensors.items()}
    with torch.no_grad():
        loss_before = float(batch_loss(trainer.student, samples, config))
    path, report = trainer.update(samples)
    # The whole batch's loss before the update, not the report's loss_before (the first epoch's
    # running mean, taken while the weights move): at a rate too high it can sit above the
    # starting loss and hide an update that made things worse.
    assert report.loss_after < loss_before
    assert len(report.step_losses) == report.n_steps == config.epochs * -(-len(samples) // config.batch_size)
    changed = {name for name, p in tensors.items() if not torch.equal(p.detach(), before[name])}
    others = set(tensors) - set(vocab)
    assert changed == (set(tensors) if train_vocab else others)

    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    with_state = {id(p) for p in trainer.optimizer.state}
    vocab_ids = {id(tensors[name]) for name in vocab}
    if train_vocab:
        assert vocab_ids <= with_state
    else:
        assert not vocab_ids & (in_optimizer | with_state)
        assert with_state == {id(tensors[name]) for name in others}  # every other tensor has its moments
        assert all(not tensors[name].requires_grad and tensors[name].grad is None for name in vocab)

    written, source = source_bytes(path), source_bytes(drafts[variant])
    for name in vocab:
        assert (written[name] == source[name]) == (not train_vocab), name
    assert written["blk.0.ffn_down.weight"] != source["blk.0.ffn_down.weight"]


def test_freezing_applies_to_a_module_trained_directly(drafts: dict[str, Path]) -> None:
    """make_optimizer (also used by offline distillation) freezes the same tensors."""
    from pyspec.online import load_gguf

    model = load_gguf(drafts["llama"])
    optimizer = make_optimizer(model, DistillConfig(train_vocab=False))
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert params == {id(p) for p in model.parameters()} - {id(model.token_embd.weight), id(model.output.weight)}
    fresh = load_gguf(drafts["llama"])
    assert len(trainable_parameters(fresh, DistillConfig())) == len(list(fresh.parameters()))


def test_train_vocab_is_validated() -> None:
    with pytest.raises(ValueError, match="train_vocab must be True or False"):
        DistillConfig(train_vocab="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("export_dtype", ["source", "source+q8_0"])
@pytest.mark.parametrize("variant", ["llama", "q4_k_m"])
def test_training_only_the_last_blocks(drafts: dict[str, Path], samples: list[TraceSample], tmp_path: Path,
                                       variant: str, export_dtype: str) -> None:
    """train_blocks=1 with the vocabulary frozen: block 1 and the output norm learn; block 0 and
    the vocabulary matrices stay bit-identical, hold no AdamW state, get no gradient, and the
    exported GGUF carries the source's bytes for them (with "source+q8_0" too, where block 1's
    matrices are written in q8_0)."""
    config = DistillConfig(lr=1e-3, epochs=2, batch_size=2, positions="all", train_vocab=False, train_blocks=1,
                           export_dtype=export_dtype)
    trainer = DraftTrainer(drafts[variant], config, tmp_path)
    tensors = trainer.student.module.gguf_tensors()
    assert trainer.student.module.config.n_layer == 2
    frozen = {name for name in tensors if name.startswith("blk.0.") or name in VOCAB}
    trained = set(tensors) - frozen
    assert trained and all(name.startswith("blk.1.") or name == "output_norm.weight" for name in trained)
    before = {name: p.detach().clone() for name, p in tensors.items()}
    with torch.no_grad():
        loss_before = float(batch_loss(trainer.student, samples, config))
    path, report = trainer.update(samples)
    assert report.loss_after < loss_before
    changed = {name for name, p in tensors.items() if not torch.equal(p.detach(), before[name])}
    assert changed == trained
    assert {id(p) for p in trainer.optimizer.state} == {id(tensors[name]) for name in trained}
    assert all(not tensors[name].requires_grad and tensors[name].grad is None for name in frozen)
    written, source = source_bytes(path), source_bytes(drafts[variant])
    for name in frozen:
        assert written[name] == source[name], name
    assert written["blk.1.ffn_down.weight"] != source["blk.1.ffn_down.weight"]
    Q = gguf.GGMLQuantizationType
    written_tensors = {t.name: t for t in open_gguf(path).tensors}
    source_types = {t.name: t.tensor_type for t in open_gguf(drafts[variant]).tensors}
    for name in trained:
        shape = [int(n) for n in written_tensors[name].shape]  # ggml order: the row length first
        if len([n for n in shape if n > 1]) < 2:
            expected = Q.F32  # vectors stay F32
        elif export_dtype == "source+q8_0":
            expected = Q.Q8_0 if shape[0] % 32 == 0 else Q.F16  # rows of whole q8_0 blocks, else F16
        else:
            expected = source_types[name]
        assert written_tensors[name].tensor_type == expected, name
    if export_dtype == "source+q8_0" and variant == "q4_k_m":
        assert any(source_types[name] not in (Q.Q8_0, Q.F32) for name in frozen)  # a real mix
    with pyspec.Engine(str(path), n_ctx=256, n_threads=1) as engine:  # llama.cpp loads the mix
        assert engine.evaluate([1, 2, 3]).shape[-1] == engine._core.n_vocab
    # Block 0's output, computed once per sequence and reused across epochs, is still what the
    # trained model computes from scratch.
    assert trainer.student.n_fixed_blocks == 1
    assert len(trainer.student._fixed) == len({s.tokens.tobytes() for s in samples})  # one per sequence
    for s in samples:
        direct = trainer.student.module.logits_at(torch.from_numpy(s.tokens.astype(np.int64)),
                                                  torch.from_numpy(s.rows.astype(np.int64)))
        assert torch.equal(trainer.student.row_logits(s).detach(), direct.detach())


def test_train_blocks_counts_from_the_last_block(drafts: dict[str, Path]) -> None:
    """0 and anything >= the number of blocks train every block; N freezes all but the last N."""
    from pyspec.online import load_gguf
    from pyspec.online.trainer import frozen_parameters

    model = load_gguf(drafts["llama"])
    block0 = {id(p) for p in model.blocks[0].parameters()}
    for n, expected in [(0, set()), (1, block0), (2, set()), (5, set())]:
        assert {id(p) for p in frozen_parameters(model, DistillConfig(train_blocks=n))} == expected, n
    with pytest.raises(ValueError, match="train_blocks must be a whole number"):
        DistillConfig(train_blocks=-1)
    with pytest.raises(ValueError, match="train_blocks must be a whole number"):
        DistillConfig(train_blocks=True)  # type: ignore[arg-type]


def test_an_update_without_export(drafts: dict[str, Path], samples: list[TraceSample], tmp_path: Path) -> None:
    """update(export=False) trains as an update does (counted, on the schedule's rate) and writes
    no file; the next exported update is the first file."""
    config = DistillConfig(lr=1e-3, lr_schedule="inverse_sqrt", epochs=1, batch_size=2, positions="all")
    trainer = DraftTrainer(drafts["llama"], config, tmp_path)
    before = trainer.student.module.gguf_tensors()["blk.1.ffn_down.weight"].detach().clone()
    path, report = trainer.update(samples, export=False)
    assert path is None and report.export_seconds == 0.0 and list(tmp_path.iterdir()) == []
    assert trainer.n_updates == 1 and report.lr == config.lr_at(1)
    assert not torch.equal(trainer.student.module.gguf_tensors()["blk.1.ffn_down.weight"].detach(), before)
    path, report = trainer.update(samples)
    assert path is not None and path.exists() and path.name == "draft-1.gguf"
    assert trainer.n_updates == 2 and report.lr == config.lr_at(2)
