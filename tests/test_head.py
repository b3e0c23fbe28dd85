"""ReDrafter draft heads on the tiny models: PyTorch and the engine compute the same head (golden
logits), training on data made by the target helps, method "redrafter" keeps greedy output
identical and sampled output distributed as the target's, heads reload while serving, and bad
head files are refused with the old head kept."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch  # a test dependency (.[test]): without it these tests fail, never skip
from test_cli import pyspec_cli
from test_greedy import PROMPTS
from test_sampling import check_first_two_tokens

import pyspec
from pyspec import HeadFileError, HeadMismatchError, InvalidArgumentError
from pyspec._models.tiny import build_tiny_model
from pyspec.data import Prompt
from pyspec.head.data import DataConfig, iter_sequences, make_training_data, plan_sequences
from pyspec.head.gguf_io import export_head, load_head, new_head, read_target
from pyspec.head.train import (
    TrainConfig, build_examples, evaluate, is_held_out, kept_vocabulary, train_head,
)

N_VOCAB = 459  # the tiny models' vocabulary
KEPT = 300     # the head predicts these many of them (the rest share one embedding row)
WORDS = "the quick brown fox jumps over lazy dog def return sum list when model answer".split()


def tiny_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    return [Prompt(id=f"tiny/{i}", suite="tiny", text=" ".join(rng.choice(WORDS, 6)), messages=[]) for i in range(n)]


def test_plans_name_sequences_by_prompt_not_by_place() -> None:
    """A plan over more prompts, in another order, names the same sequences (so a data
    directory made for a smaller plan is reused), and greedy answers are planned for every prompt."""
    small = plan_sequences(tiny_prompts(10), (0.0, 1.0), 2)
    large = plan_sequences(list(reversed(tiny_prompts(30))), (0.0, 1.0), 2)
    assert {spec.key for _, spec in small} < {spec.key for _, spec in large}
    assert sum(spec.temperature == 0 for _, spec in large) == 30
    assert 0 < sum(spec.temperature > 0 for _, spec in large) < 30


def test_evaluate_top_k_is_the_top_k_of_the_full_rows(tiny_target: str) -> None:
    """Engine.evaluate_top_k (the top-k taken in C++ on the engine's threads, no full row kept)
    against the full rows of evaluate_hidden, from a first row on; k and first_row are checked."""
    with pyspec.Engine(tiny_target, n_ctx=512, n_batch=64, n_threads=2) as engine:
        tokens = engine.tokenize(" ".join(WORDS * 12))  # > n_batch: rows from several decodes
        logits, hidden = engine.evaluate_hidden(tokens)
        ids, probs, top_hidden = engine.evaluate_top_k(tokens, 8, first_row=5)
        assert ids.shape == probs.shape == (len(tokens) - 5, 8) and top_hidden.shape == (len(tokens) - 5, hidden.shape[1])
        np.testing.assert_array_equal(top_hidden, hidden[5:])
        rows = logits[5:].astype(np.float64)
        full = np.exp(rows - rows.max(1, keepdims=True))
        full /= full.sum(1, keepdims=True)
        np.testing.assert_allclose(probs, np.take_along_axis(full, ids, axis=1), rtol=1e-4, atol=1e-7)
        expected = -np.sort(-full, axis=1)[:, :8]
        np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-7)  # the k largest, likeliest first
        with pytest.raises(InvalidArgumentError, match="k must be"):
            engine.evaluate_top_k(tokens, 0)
        with pytest.raises(InvalidArgumentError, match="first_row"):
            engine.evaluate_top_k(tokens, 4, first_row=len(tokens))


def tiny_head_data(tiny_target: str, work: Path) -> dict[str, object]:
    """Data made by the tiny target in work/data (greedy and sampled answers to 60 prompts),
    split into training and held-out sequences, the kept vocabulary, the target's rows of it and
    the column of each target token (-1: not kept)."""
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as engine:
        make_training_data(engine, plan_sequences(tiny_prompts(60), (0.0, 1.0), 2), work / "data",
                           DataConfig(max_tokens=48, chat=False))
    seqs = list(iter_sequences(work / "data"))
    train = [s for s in seqs if not is_held_out(s.prompt_id, 0.15)]
    held = [s for s in seqs if is_held_out(s.prompt_id, 0.15)]
    vocab = kept_vocabulary(train, KEPT, N_VOCAB)
    column_of = np.full(N_VOCAB, -1)
    column_of[vocab] = np.arange(len(vocab))
    return {"work": work, "train": train, "held": held, "vocab": vocab, "weights": read_target(tiny_target, vocab),
            "column_of": column_of}


@pytest.fixture(scope="module")
def head_files(tmp_path_factory: pytest.TempPathFactory, tiny_target: str) -> dict[str, object]:
    """An untrained and a trained head for the tiny target (data made by the target: greedy and
    sampled answers), in f32 and q8_0, and the held-out evaluation before and after training."""
    work = tmp_path_factory.mktemp("head")
    data = tiny_head_data(tiny_target, work)
    train, held, vocab, weights, column_of = (data[k] for k in ("train", "held", "vocab", "weights", "column_of"))
    torch.manual_seed(0)
    head = new_head(weights, vocab, n_res_layers=2)
    export_head(head, weights.info, work / "untrained.gguf", dtype="f32")
    held_ex = build_examples(held, column_of, 5)
    before = evaluate(head, held_ex)
    state = train_head(head, build_examples(train, column_of, 5), held_ex,
                       TrainConfig(epochs=6, batch_size=64, lr=3e-3, eval_every=10**6), work / "train")
    files = {"untrained": work / "untrained.gguf", "f32": work / "f32.gguf", "q8_0": work / "q8_0.gguf"}
    export_head(head, weights.info, files["f32"], dtype="f32")
    export_head(head, weights.info, files["q8_0"], dtype="q8_0")
    return {"files": {k: str(v) for k, v in files.items()}, "head": head.eval(), "before": before,
            "after": state.history[-1], "dir": work, "train": build_examples(train, column_of, 5),
            "held_out": held_ex, "weights": weights, "vocab": vocab}


@pytest.fixture(scope="module")
def head_engine(tiny_target: str, head_files: dict[str, object]):
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=head_files["files"]["f32"]) as engine:
        yield engine


def test_training_improves_held_out_prediction(head_files: dict[str, object]) -> None:
    before, after = head_files["before"], head_files["after"]
    assert after["loss"] < before["loss"] - 1.0
    # acc@1 of the trained head on held-out prompts well above the untrained one's.
    assert after["acc"][0] > before["acc"][0] + 0.25, (before, after)
    assert after["chain"][1] > before["chain"][1]


def test_bench_with_a_head(tiny_target: str, head_files: dict[str, object], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`pyspec bench --head`: redrafter drafts with the head, auto:no-head never does, every
    method's greedy output equals none's; redrafter without a head and a missing head file are
    refused before anything runs."""
    from pyspec.bench import format_markdown, run_bench

    # What each method asked generate() for: auto:no-head must reach the engine as auto_head=False
    # (the tiny head may well not pay under the tiny model's real costs, so "no head chains" alone
    # would not show it).
    asked = []
    generate = pyspec.Engine.generate

    def recording(self, *args, **kwargs):
        asked.append((kwargs.get("method"), kwargs.get("auto_head")))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(pyspec.Engine, "generate", recording)
    prompts = PROMPTS[:2]
    report = run_bench(tiny_target, None, prompts, max_tokens=24, methods="none,redrafter:2x3,auto,auto:no-head",
                       n_threads=2, n_ctx=512, progress=False, head=head_files["files"]["f32"])
    assert report.head == "f32.gguf" and "head f32.gguf" in format_markdown(report)
    by = {r.method: r for r in report.results}
    assert all(r.greedy_identical == len(prompts) for r in report.results), format_markdown(report)
    assert sum(x.n_head_drafts for x in by["redrafter:2x3"].per_prompt) > 0
    assert all(x.n_head_drafts == 0 for x in by["auto:no-head"].per_prompt)
    assert asked.count(("auto", False)) == len(prompts) + 1  # its warm-up and its runs
    assert asked.count(("auto", None)) == len(prompts) + 1
    with pytest.raises(ValueError, match="redrafter need a draft head"):
        run_bench(tiny_target, None, prompts, methods="none,redrafter", progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_bench(tiny_target, None, prompts, methods="none,auto", progress=False, head=str(tmp_path / "no.gguf"))


def test_bf16_training_learns_as_float32_does(head_files: dict[str, object]) -> None:
    """--bf16 (autocast matrix products) trains the same head from the same start to about the
    float32 run's held-out loss and accuracy, and its weights stay float32 (what export writes)."""
    torch.manual_seed(0)
    head = new_head(head_files["weights"], head_files["vocab"], n_res_layers=2)
    state = train_head(head, head_files["train"], head_files["held_out"],
                       TrainConfig(epochs=6, batch_size=64, lr=3e-3, eval_every=10**6, bf16=True),
                       head_files["dir"] / "train_bf16", held_out_answers=head_files["held_out"])
    before, f32, bf16 = head_files["before"], head_files["after"], state.history[-1]
    # The same seed, data and steps: bfloat16 products make a different (if close) head.
    assert bf16["loss"] != f32["loss"]
    # The target's answers evaluated apart (here the same held-out set): the same figures.
    assert bf16["answers"] == {k: bf16[k] for k in ("loss", "acc", "chain")}
    assert all(p.dtype == torch.float32 for p in head.parameters())
    assert bf16["loss"] < before["loss"] - 1.0
    assert bf16["loss"] < f32["loss"] * 1.1 + 0.1, (f32, bf16)
    assert bf16["acc"][0] > f32["acc"][0] - 0.1, (f32, bf16)


def assert_quantized_logits_close(logits: np.ndarray, ref: np.ndarray) -> None:
    """q8_0 weights move logits by ~1e-2 relative; the top token may differ only at near-ties."""
    scale = np.abs(ref).max()
    assert np.abs(logits - ref).max() < 0.03 * scale
    top2 = np.sort(ref, axis=1)[:, -2:]
    flips = np.flatnonzero(logits.argmax(1) != ref.argmax(1))
    assert all(top2[i, 1] - top2[i, 0] < 0.05 * scale for i in flips), flips


@pytest.mark.parametrize("dtype,atol", [("f32", 1e-4), ("q8_0", None)])
def test_engine_head_equals_pytorch_head(head_engine, head_files: dict[str, object], dtype: str, atol) -> None:
    """Golden logits: the same hidden states and tokens through the PyTorch head and the engine's
    ggml head, three recurrent steps. f32 weights agree to float rounding; q8_0 weights (and
    ggml's q8_0 activations) move logits by ~1e-2 relative, and the top token agrees except at
    near-ties."""
    head = head_files["head"]
    core = head_engine._core.load_head(head_files["files"][dtype])
    tokens = head_engine.tokenize(PROMPTS[2])
    _, hidden = head_engine.evaluate_hidden(tokens)
    n, d = hidden.shape
    state = np.zeros((n, d), np.float32)
    t_state = torch.zeros(n, d)
    x = torch.from_numpy(hidden)
    for step in range(3):
        toks = tokens[step:] + tokens[:step]  # different previous tokens each step
        logits, state = core.step(hidden, state, [core.row_of(t) for t in toks])
        with torch.no_grad():
            ref, t_state = head.step(x, t_state, head.row_of[torch.tensor(toks)])
        ref = ref.numpy()
        assert logits.shape == ref.shape == (n, KEPT)
        if atol is not None:
            np.testing.assert_allclose(logits, ref, atol=atol)
            np.testing.assert_allclose(state, t_state.numpy(), atol=atol)
        else:
            assert_quantized_logits_close(logits, ref)
            state = t_state.numpy().astype(np.float32)  # keep the q8_0 run on the reference path


def test_untrained_and_trained_head_in_the_engine(head_engine, head_files: dict[str, object]) -> None:
    """The engine drafts with what the head learned: acceptance rises after training."""
    rates = {}
    for name in ("untrained", "f32"):
        head_engine.reload_head(head_files["files"][name])
        r = head_engine.generate(PROMPTS[0], max_tokens=64, method="redrafter", beams=2, beam_length=4)
        rates[name] = r.stats.acceptance_rate
    assert rates["f32"] > rates["untrained"] + 0.1, rates


@pytest.mark.parametrize("beams,length", [(1, 5), (2, 5), (4, 5), (3, 2)])
def test_redrafter_greedy_equals_plain(head_engine, beams: int, length: int) -> None:
    for prompt in PROMPTS:
        plain = head_engine.generate(prompt, max_tokens=48, method="none")
        spec = head_engine.generate(prompt, max_tokens=48, method="redrafter", beams=beams, beam_length=length)
        assert spec.tokens == plain.tokens, (beams, length, prompt)
        s = spec.stats
        assert s.n_generated == s.n_accepted + s.n_target_calls
        assert s.n_candidate_tokens <= beams * length * s.n_target_calls
        assert spec.head_version == head_engine.head_version > 0


def test_redrafter_with_backend_argmax_equals_plain(head_engine) -> None:
    """The head reads the target's hidden states while the target's rows' argmax is taken on the
    backend (hidden output makes every batch token an output row of its sequence)."""
    for prompt in PROMPTS:
        plain = head_engine.generate(prompt, max_tokens=40, method="none", backend_argmax=False)
        spec = head_engine.generate(prompt, max_tokens=40, method="redrafter", beams=2, beam_length=4,
                                    backend_argmax=True)
        assert spec.stats.backend_argmax and spec.stats.n_head_drafts > 0
        assert spec.tokens == plain.tokens, prompt


# -- method "eagle": EAGLE-2's dynamic tree over the head -------------------------------------------


@pytest.mark.parametrize("nodes,depth,branching,expand", [(8, 6, 4, 1), (16, 5, 3, 4), (4, 2, 8, 8), (30, 8, 2, 3)])
def test_eagle_tree_greedy_equals_plain(head_engine, nodes: int, depth: int, branching: int, expand: int) -> None:
    for prompt in PROMPTS:
        plain = head_engine.generate(prompt, max_tokens=48, method="none")
        spec = head_engine.generate(prompt, max_tokens=48, method="eagle", tree_nodes=nodes, tree_depth=depth,
                                    tree_branching=branching, tree_expand=expand)
        assert spec.tokens == plain.tokens, (nodes, depth, prompt)
        s = spec.stats
        assert s.n_generated == s.n_accepted + s.n_target_calls
        assert s.n_drafted <= nodes * s.n_target_calls
        assert len(s.accept_histogram) == depth + 1
        assert s.n_head_drafts == s.n_target_calls - s.n_empty_drafts > 0
        assert spec.head_version == head_engine.head_version > 0


def test_eagle_tree_accepts_more_than_one_chain(head_engine) -> None:
    """With the same head, a tree of 16 nodes accepts more per target call than a chain of its
    depth (a beam of one), and the tree keeps to its node budget."""
    chain = head_engine.generate(PROMPTS[1], max_tokens=64, method="redrafter", beams=1, beam_length=5)
    tree = head_engine.generate(PROMPTS[1], max_tokens=64, method="eagle", tree_nodes=16, tree_depth=5,
                                tree_branching=4, tree_expand=4)
    assert tree.tokens == chain.tokens
    assert tree.stats.mean_accepted_depth > chain.stats.mean_accepted_depth
    assert tree.stats.mean_draft_size <= 16


def test_eagle_tree_samples_target_distribution(head_engine) -> None:
    """Joint distribution of the first two sampled tokens (T = 1, top_k 6): the second is drafted
    by the head's tree (deterministic candidates) and verified with exact multi-candidate
    rejection sampling."""
    prompt = head_engine.tokenize(PROMPTS[0])
    _, _, n_accepted, _ = check_first_two_tokens(head_engine, prompt, method="eagle", tree_nodes=8, tree_depth=3,
                                                 tree_branching=3, tree_expand=2)
    assert n_accepted > 0


def test_eagle_needs_a_head_and_a_fitting_tree(tiny_target: str, head_engine) -> None:
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1) as engine:
        with pytest.raises(InvalidArgumentError, match="head"):
            engine.generate(PROMPTS[0], max_tokens=4, method="eagle")
    with pytest.raises(InvalidArgumentError, match="n_nodes"):
        head_engine.generate(PROMPTS[0], max_tokens=4, method="eagle", tree_nodes=0)


def test_redrafter_accepts_and_compresses(head_engine) -> None:
    r = head_engine.generate(PROMPTS[1], max_tokens=64, method="redrafter", beams=4, beam_length=5)
    s = r.stats
    assert s.n_accepted > 0 and s.tokens_per_target_call > 1.3
    assert s.compression_ratio > 1.0  # beams share prefixes: fewer tree nodes than beam tokens
    assert s.n_empty_drafts >= 1       # the first step has no hidden state yet: a plain step


def test_redrafter_samples_target_distribution(head_engine) -> None:
    """Joint distribution of the first two sampled tokens (T = 1, top_k 6): the second is
    drafted by the head's beams (deterministic candidates) and verified exactly."""
    prompt = head_engine.tokenize(PROMPTS[0])
    _, _, n_accepted, _ = check_first_two_tokens(head_engine, prompt, method="redrafter", beams=2, beam_length=3)
    assert n_accepted > 0


def test_seeded_redrafter_samples_what_plain_decoding_samples(head_engine) -> None:
    """Beam candidates are one-hot proposals, verified with one draw from the target per position,
    so a seeded sampled request emits exactly plain decoding's tokens."""
    for seed in range(5):
        options = dict(max_tokens=40, temperature=0.8, top_p=0.95, seed=seed)
        plain = head_engine.generate(PROMPTS[2], method="none", **options)
        spec = head_engine.generate(PROMPTS[2], method="redrafter", beams=3, beam_length=4, **options)
        assert spec.tokens == plain.tokens
        assert spec.stats.n_accepted > 0 or seed > 0


def test_reload_head_while_serving(tiny_target: str, head_files: dict[str, object]) -> None:
    """A new head loads while a generation runs and serves from the next request; the running one
    finishes with the head it started with, and its output stays the target's."""
    files = head_files["files"]
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=files["untrained"]) as engine:
        assert engine.head_version == 1
        plain = engine.generate(PROMPTS[2], max_tokens=200, method="none").tokens
        started = threading.Event()
        pieces: list[str] = []
        stream = engine.stream(PROMPTS[2], max_tokens=200, method="redrafter", beams=2, beam_length=4)

        def consume() -> None:
            for piece in stream:
                pieces.append(piece)
                started.set()

        worker = threading.Thread(target=consume)
        worker.start()
        started.wait(timeout=30)
        version = engine.reload_head(files["f32"])  # loads now; swaps when the stream is done
        worker.join()
        assert version == 2 == engine.head_version
        assert stream.result is not None and stream.result.head_version == 1
        assert stream.result.tokens == plain
        after = engine.generate(PROMPTS[2], max_tokens=200, method="redrafter", beams=2, beam_length=4)
        assert after.head_version == 2 and after.tokens == plain
        assert after.stats.acceptance_rate > stream.result.stats.acceptance_rate


def test_bad_head_files_keep_the_old_head(tmp_path: Path, tiny_target: str, head_files: dict[str, object]) -> None:
    files = head_files["files"]
    good = Path(files["f32"]).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[: len(good) - 4096])
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a head")
    # A head for another target: same vocabulary, other weights and width.
    other_target = build_tiny_model(tmp_path / "wide.gguf", seed=5, n_embd=96)
    other_vocab = np.arange(0, KEPT)
    other = new_head(read_target(other_target, other_vocab), other_vocab)
    other_path = export_head(other, read_target(other_target, other_vocab).info, tmp_path / "other.gguf", dtype="f32")
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2, head=files["f32"]) as engine:
        before = engine.generate(PROMPTS[0], max_tokens=30, method="redrafter")
        cases = [
            (tmp_path / "missing.gguf", FileNotFoundError, "not found"),
            (not_gguf, HeadFileError, "not a GGUF file"),
            (cut, HeadFileError, "truncated"),
            (tiny_target, HeadFileError, "not a draft head"),
            (other_path, HeadMismatchError, "hidden width '96'"),
        ]
        for path, error, message in cases:
            with pytest.raises(error, match=message):
                engine.reload_head(path)
            assert engine.head_version == 1 and engine.head_path == files["f32"]
        after = engine.generate(PROMPTS[0], max_tokens=30, method="redrafter")
        assert after.tokens == before.tokens and after.stats.n_accepted == before.stats.n_accepted


def test_head_for_a_renamed_target_is_refused(tmp_path: Path, tiny_target: str, head_files: dict[str, object]) -> None:
    """The file names its target; the same weights under another general.name are another target."""
    import gguf

    renamed = tmp_path / "renamed.gguf"
    data = bytearray(Path(tiny_target).read_bytes())
    reader = gguf.GGUFReader(tiny_target)
    field = reader.fields["general.name"]
    part = field.parts[field.data[0]]
    offset = part.ctypes.data - reader.data.ctypes.data
    data[offset: offset + len(part)] = b"X" * len(part)
    renamed.write_bytes(bytes(data))
    with pyspec.Engine(str(renamed), n_ctx=256, n_threads=2) as engine:
        with pytest.raises(HeadMismatchError, match="name 'pyspec-tiny'"):
            engine.reload_head(head_files["files"]["f32"])
        assert engine.head_version == 0


def test_redrafter_without_a_head(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        with pytest.raises(InvalidArgumentError, match="needs a draft head"):
            engine.generate("hello", method="redrafter")
        with pytest.raises(InvalidArgumentError, match="beam n_beams"):
            engine.generate("hello", method="redrafter", beams=0)


def test_head_gguf_round_trip(head_files: dict[str, object]) -> None:
    head = head_files["head"]
    loaded, info = load_head(head_files["files"]["f32"])
    assert info.name == "pyspec-tiny" and info.n_vocab == N_VOCAB
    assert torch.equal(loaded.vocab, head.vocab)
    for (name, a), (_, b) in zip(sorted(head.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.allclose(a, b), name


def test_train_head_command_makes_data_trains_resumes_and_exports(tmp_path: Path, tiny_target: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`pyspec train-head` end to end on the tiny target (HumanEval prompts through its chat
    template): data and training each stopped by --time-budget and resumed, held-out report, the
    GGUF, remembered for the target; a last run finds nothing to do, and `pyspec generate` drafts
    with the result, given with --head or not."""
    import json

    from pyspec.head.known import known_head

    monkeypatch.setenv("PYSPEC_HEADS", str(tmp_path / "heads"))  # the heads this test remembers stay its own

    from pyspec.data import load_prompt_slices

    args = ["train-head", "--target", tiny_target, "--data", str(tmp_path / "data"), "--out", str(tmp_path / "h.gguf"),
            "--prompts", "humaneval[0:8]", "--max-tokens", "24", "--kept-vocab", "200", "--epochs", "3",
            "--batch-size", "32", "--eval-fraction", "0.25", "--eval-every", "5", "--dtype", "f32", "--threads", "2",
            "--repack", "off", "--no-huge-pages", "--json"]  # the engine flags reach the data's engine
    plan = plan_sequences(load_prompt_slices(["humaneval[0:8]"]), (0.0, 0.8), 3)
    assert 8 < len(plan) < 16 and sum(spec.temperature == 0 for _, spec in plan) == 8  # greedy for all, some sampled
    no_time = pyspec_cli(*args, "--time-budget", "0")  # one sequence (every run makes progress), no training
    assert no_time.returncode == 0, no_time.stderr
    report = json.loads(no_time.stdout)
    assert report["data_made"] == 1 and report["data_planned"] == len(plan)
    assert report["total_steps"] is None and not report["finished"]
    assert len(list((tmp_path / "data").glob("*.npz"))) == 1
    # The rest of the same plan through the library (what the command's next run would make).
    with pyspec.Engine(tiny_target, n_ctx=4096, n_threads=2) as engine:
        made = make_training_data(engine, plan, tmp_path / "data", DataConfig(max_tokens=24))
    assert made == (len(plan) - 1, True)
    # One step, a checkpoint, no head yet; the next run resumes with other torch threads.
    partial = pyspec_cli(*args, "--time-budget", "0", "--train-threads", "1")
    assert partial.returncode == 0, partial.stderr
    report = json.loads(partial.stdout)
    assert report["data_made"] == 0
    assert report["step"] == 1 and not report["finished"] and not (tmp_path / "h.gguf").exists()
    first = pyspec_cli(*args)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["data_made"] == 0 and report["finished"] and report["step"] == report["total_steps"] > 1
    assert report["kept_vocab"] == 200 and 0 < report["coverage_train"] <= 1
    assert report["n_held_out_sequences"] > 0 and "acc" in report["history"][-1]
    assert report["remembered"] and known_head(tiny_target) == (tmp_path / "h.gguf").resolve()
    steps = report["history"][-1]["step"]
    again = pyspec_cli(*args)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert resumed["data_made"] == 0 and resumed["history"][-1]["step"] == steps
    gen = pyspec_cli("generate", "--target", tiny_target, "--head", str(tmp_path / "h.gguf"), "--prompt", "def f():",
                     "--max-tokens", "16", "--method", "redrafter", "--beams", "2", "--json")
    assert gen.returncode == 0, gen.stderr
    assert json.loads(gen.stdout)["head_version"] == 1
    known = pyspec_cli("generate", "--target", tiny_target, "--prompt", "def f():", "--max-tokens", "16", "--method",
                       "eagle", "--json")  # the remembered head, no --head
    assert known.returncode == 0, known.stderr
    assert json.loads(known.stdout)["head_version"] == 1
    none = pyspec_cli("generate", "--target", tiny_target, "--no-head", "--prompt", "def f():", "--max-tokens", "8",
                      "--method", "eagle")
    assert none.returncode != 0 and "head" in none.stderr
    # --init-from: a new run starts from the trained head (its vocabulary, its weights: the
    # held-out loss before any step is the finished run's, not an untrained head's).
    tuned_args = [a if a != str(tmp_path / "h.gguf") else str(tmp_path / "h2.gguf") for a in args]
    tuned = pyspec_cli(*tuned_args, "--init-from", str(tmp_path / "h.gguf"), "--kept-vocab", "100", "--epochs", "1")
    assert tuned.returncode == 0, tuned.stderr
    tuned_report = json.loads(tuned.stdout)
    assert tuned_report["init_from"] == str(tmp_path / "h.gguf") and tuned_report["kept_vocab"] == 200
    start_loss, end_loss = tuned_report["history"][0]["loss"], report["history"][-1]["loss"]
    assert tuned_report["history"][0]["step"] == 0 and abs(start_loss - end_loss) < 1e-3 * end_loss, \
        (start_loss, end_loss, report["history"][0]["loss"])
    # A head of another target shape (width 96, not 64) is refused, naming the mismatch.
    wide = build_tiny_model(tmp_path / "wide.gguf", seed=3, n_embd=96)
    no_prompts = [a for a in tuned_args if a not in ("--prompts", "humaneval[0:8]")]  # the data as it is
    wrong = pyspec_cli(*[a if a != tiny_target else str(wide) for a in no_prompts],
                       "--init-from", str(tmp_path / "h.gguf"), "--work-dir", str(tmp_path / "w3"))
    assert wrong.returncode == 1 and "trained for another target" in wrong.stderr and "width 64" in wrong.stderr, \
        wrong.stderr


def test_reference_sequences_are_the_targets_rows_over_the_reference_text(tmp_path: Path, tiny_target: str) -> None:
    """Teacher forcing: a HumanEval / GSM8K prompt's reference answer appended to the prompt and
    evaluated once; the stored rows start at the end of the chat template's preamble and hold the
    target's own hidden states and distributions there. Prompts without a reference (MT-Bench)
    are answered by the target."""
    from pyspec.data import load_prompt_slices
    from pyspec.head.data import iter_sequences, reference_answer

    prompts = load_prompt_slices(["humaneval[0:2]", "gsm8k[0:2]", "mtbench[0:1]"])
    plan = plan_sequences(prompts, (0.0,), 1, reference=True)
    assert [spec.source for _, spec in plan] == ["reference"] * 4 + ["target"]
    assert "<<" not in reference_answer(prompts[2]) and reference_answer(prompts[2]).endswith(".")
    with pyspec.Engine(tiny_target, n_ctx=4096, n_threads=2) as engine:
        config = DataConfig(max_tokens=8, reference_max_tokens=40)
        assert make_training_data(engine, plan, tmp_path, config) == (5, True)
        by_id = {(s.prompt_id, s.temperature): s for s in iter_sequences(tmp_path)}
        for prompt in prompts[:4]:
            seq = by_id[(prompt.id, 0.0)]
            prompt_tokens = engine.prompt_tokens(prompt.messages)
            answer = engine.tokenize(reference_answer(prompt), add_special=False, parse_special=False)[:40]
            assert list(seq.tokens) == prompt_tokens + answer
            assert 0 <= seq.first_row < len(prompt_tokens) - 1  # the user's message's rows are kept too
            assert seq.n_rows == len(seq.tokens) - seq.first_row
            logits, hidden = engine.evaluate_hidden(list(seq.tokens))
            assert (seq.top_ids[:, 0] == logits[seq.first_row:].argmax(axis=1)).all()
            np.testing.assert_allclose(seq.hidden, hidden[seq.first_row:], atol=2e-2, rtol=1e-2)
        # The MT-Bench prompt: the target's greedy answer, rows from the last prompt token.
        mt = by_id[(prompts[4].id, 0.0)]
        assert mt.first_row == len(engine.prompt_tokens(prompts[4].messages)) - 1
    # Each sequence says where its text came from (the trainer evaluates the target's answers
    # apart); files written before that was stored are told apart by their names.
    assert sorted(s.source for s in by_id.values()) == ["reference"] * 4 + ["target"]
    for path in tmp_path.glob("*.npz"):
        with np.load(path) as f:
            np.savez(path, **{k: f[k] for k in f.files if k != "source"})
    assert sorted(s.source for s in iter_sequences(tmp_path)) == ["reference"] * 4 + ["target"]


def test_online_fine_tuning_of_the_head(tiny_target: str, head_files: dict[str, object]) -> None:
    """The draft model's online loop (OnlineDistiller) trains the head too: requests are served
    with method redrafter, an update trains the head in the training process on the target's
    hidden states and distributions, the new head is reloaded; outputs stay the target's."""
    from pyspec.head.online import HeadDistiller
    from pyspec.online.config import DistillConfig

    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=1, head=head_files["files"]["untrained"]) as engine:
        distiller = HeadDistiller(engine, DistillConfig(lr=3e-3, positions="all", epochs=4, train_threads=1,
                                                        export_dtype="f32"), update_interval=100)
        try:
            before = [distiller.generate(p, max_tokens=48) for p in PROMPTS]
            assert all(r.head_version == 1 for r in before)
            assert distiller.update_now(wait=True, timeout=300), distiller.stats().last_error
            stats = distiller.stats()
            assert stats.draft_version == engine.head_version == 2 and stats.n_updates == 1
            assert stats.last_report.loss_after < stats.last_report.loss_before
            after = [distiller.generate(p, max_tokens=48) for p in PROMPTS]
            assert all(r.head_version == 2 for r in after)
            for p, r in zip(PROMPTS, after):
                assert r.tokens == engine.generate(p, max_tokens=48, method="none").tokens
        finally:
            distiller.close()


# -- method "auto" with a head ----------------------------------------------------------------------


def install_target_cost(engine: pyspec.Engine, ms: tuple[float, float]) -> None:
    """A synthetic target curve: one token costs ms[0], 64 tokens ms[1], linear between. Planned
    with auto_adapt_costs=False (otherwise the engine corrects it from the real step times)."""
    engine._core.set_cost(False, pyspec.CostCurve((1, 64), ms)._core(), "")


# Target steps of a second: the head's own step, timed for real (a fraction of a ms on the tiny
# head, several ms on a machine loaded by parallel test runs), stays negligible beside them, so
# the tests see the curve's shape alone (at 10 ms a step, a loaded machine's head step once cost
# nearly as much as verifying, and auto rightly left the head out).
FLAT = (1000.0, 1000.0)             # verifying 64 tokens costs what one does (a GPU-like curve)
DEAR = (1000.0, 1000.0 + 63 * 400)  # each verified token adds 0.4 of a one-token step


def test_auto_drafts_with_a_head_where_it_pays(tiny_target: str, head_files: dict[str, object]) -> None:
    """With free verification the trained head's chains pay: auto drafts them (no draft model,
    non-repetitive prompts, so lookup has little to offer), they are accepted, and the output is
    plain decoding's."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=head_files["files"]["f32"]) as engine:
        install_target_cost(engine, FLAT)
        for prompt in PROMPTS:
            plain = engine.generate(prompt, max_tokens=48, method="none")
            auto = engine.generate(prompt, max_tokens=48, auto_adapt_costs=False)
            assert auto.tokens == plain.tokens, prompt
            s = auto.stats
            assert auto.head_version == 1
            assert s.n_head_drafts > 0 and 0 < s.n_head_accepted <= s.n_accepted, s
            assert s.n_draft_decodes == 0  # no draft model
        off = engine.generate(PROMPTS[1], max_tokens=48, auto_adapt_costs=False, auto_head=False)
        assert off.stats.n_head_drafts == 0 and off.head_version == 0


def test_auto_drafts_head_trees_pruned_to_what_pays(tiny_target: str, head_files: dict[str, object]) -> None:
    """Where the head pays, auto drafts head trees (EAGLE-2, up to auto_head_tree_nodes nodes)
    pruned by its planner: it verifies more than the chain's one path per step, keeps within the
    budget and gives plain decoding's output; auto_head_tree_nodes=0 drafts chains as before."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=head_files["files"]["f32"]) as engine:
        install_target_cost(engine, FLAT)
        trees = chains = 0.0
        for prompt in PROMPTS:
            plain = engine.generate(prompt, max_tokens=48, method="none")
            # No phrase pool: the first run's output would be a free draft for the second.
            tree = engine.generate(prompt, max_tokens=48, auto_adapt_costs=False, auto_head_tree_nodes=12, pool=False)
            chain = engine.generate(prompt, max_tokens=48, auto_adapt_costs=False, auto_head_tree_nodes=0, pool=False)
            assert tree.tokens == plain.tokens == chain.tokens, prompt
            assert tree.stats.n_head_drafts > 0 and chain.stats.n_head_drafts > 0
            assert tree.stats.n_drafted <= 12 * tree.stats.n_target_calls
            trees += tree.stats.n_drafted / tree.stats.n_head_drafts
            chains += chain.stats.n_drafted / chain.stats.n_head_drafts
        assert trees > chains  # a tree verifies other choices besides the chain's path
        with pytest.raises(InvalidArgumentError, match="head_tree_nodes"):
            engine.generate(PROMPTS[0], max_tokens=4, auto_head_tree_nodes=64)


def test_auto_drops_a_head_that_does_not_pay(tiny_target: str, head_files: dict[str, object]) -> None:
    """Verification that costs 0.4 of a step per token: the optimistic prior gets the untrained
    head tried, its real acceptance stops it within a few drafts, and it stays stopped in later
    requests; a reloaded head starts afresh and is tried again."""
    files = head_files["files"]
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=files["untrained"]) as engine:
        install_target_cost(engine, DEAR)
        plain = engine.generate(PROMPTS[2], max_tokens=48, method="none")
        first = engine.generate(PROMPTS[2], max_tokens=48, auto_adapt_costs=False)
        assert first.tokens == plain.tokens
        assert 0 < first.stats.n_head_drafts <= 6, first.stats
        later = engine.generate(PROMPTS[2], max_tokens=48, auto_adapt_costs=False)
        assert later.tokens == plain.tokens and later.stats.n_head_drafts == 0
        engine.reload_head(files["untrained"])
        again = engine.generate(PROMPTS[2], max_tokens=48, auto_adapt_costs=False)
        assert again.tokens == plain.tokens and again.stats.n_head_drafts > 0


def test_auto_with_a_head_on_measured_costs_equals_plain(tiny_target: str, tiny_drafts: dict[str, str],
                                                         head_files: dict[str, object]) -> None:
    """The engine's own calibration, corrected online, with a head and a draft model loaded:
    whatever auto picks, greedy output is plain decoding's."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2,
                       head=head_files["files"]["f32"]) as engine:
        for prompt in PROMPTS:
            assert engine.generate(prompt, max_tokens=48).tokens == engine.generate(prompt, max_tokens=48,
                                                                                    method="none").tokens


def test_auto_head_samples_target_distribution(tiny_target: str, head_files: dict[str, object]) -> None:
    """Head chains are deterministic candidates: auto's sampled output keeps the target's
    distribution (chi-square of the first two tokens; the second is drafted by the head), and a
    seeded request samples exactly what plain decoding samples."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=head_files["files"]["f32"]) as engine:
        install_target_cost(engine, FLAT)
        prompt = engine.tokenize(PROMPTS[0])
        _, _, n_accepted, _ = check_first_two_tokens(engine, prompt, method="auto", auto_adapt_costs=False)
        assert n_accepted > 0
        for seed in range(5):
            options = dict(max_tokens=40, temperature=0.8, top_p=0.95, seed=seed)
            plain = engine.generate(PROMPTS[2], method="none", **options)
            auto = engine.generate(PROMPTS[2], auto_adapt_costs=False, **options)
            assert auto.tokens == plain.tokens
            assert auto.stats.n_head_drafts > 0


def test_a_prompt_longer_than_the_window_is_skipped_not_fatal(tmp_path: Path, tiny_target: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Data runs over thousands of conversations: one that does not fit the context window is
    left out with a warning naming it, and every other sequence is still made."""
    texts = {"tiny/0": "the quick fox", "tiny/long": " ".join(WORDS * 60), "tiny/1": "a lazy dog", "tiny/2": "def sum"}
    prompts = [Prompt(id=i, suite="tiny", text=t, messages=[{"role": "user", "content": t}]) for i, t in texts.items()]
    plan = plan_sequences(prompts, (0.0,), 1)
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        assert len(engine.prompt_tokens(prompts[1].render(True))) > 256
        with caplog.at_level("WARNING", logger="pyspec.head.data"):
            made = make_training_data(engine, plan, tmp_path, DataConfig(max_tokens=8))
    assert made == (3, True)
    assert sorted(s.prompt_id for s in iter_sequences(tmp_path)) == ["tiny/0", "tiny/1", "tiny/2"]
    assert "tiny/long" in caplog.text and "context window" in caplog.text


# -- the server with a head ---------------------------------------------------------------------------


def test_server_serves_and_learns_the_head_online(tiny_target: str, head_files: dict[str, object],
                                                  tmp_path: Path) -> None:
    """`pyspec serve --head H --online` (no draft model): requests draft with the head, the head
    is fine-tuned from the served traffic and reloaded, and greedy output stays the target's."""
    import openai
    from server_process import ServerProcess
    from test_server import tie_free_prompt

    greedy = {"temperature": 0.0}
    proc = ServerProcess("--target", tiny_target, "--head", head_files["files"]["untrained"], "--model-name", "tiny",
                         "--n-ctx", "512", "--threads", "1", "--method", "redrafter", "--online",
                         "--online-interval", "4", "--online-lr", "3e-3", "--online-work-dir", str(tmp_path / "heads"),
                         log_path=tmp_path / "online-head.log")
    try:
        c = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0)
        for i in range(8):
            r = c.completions.create(model="tiny", prompt=f"{WORDS[i]} {WORDS[i + 1]} the", max_tokens=24, **greedy)
            assert r.model_extra["pyspec"]["method"] == "redrafter" and r.model_extra["pyspec"]["head_version"] >= 1
        assert proc.metric("pyspec_head_version") >= 1
        deadline = time.monotonic() + 180
        while proc.metric("pyspec_online_updates_total") < 1:
            assert time.monotonic() < deadline, proc.log()
            assert proc.metric("pyspec_online_failed_updates_total") == 0, proc.log()
            time.sleep(0.2)
        assert proc.metric("pyspec_head_version") >= 2
        with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as reference:
            prompt = tie_free_prompt(reference, [f"{WORDS[i]} {WORDS[-1 - i]} model" for i in range(len(WORDS) // 2)], 16)
        after = c.completions.create(model="tiny", prompt=prompt, max_tokens=16, **greedy)
        plain = c.completions.create(model="tiny", prompt=prompt, max_tokens=16, extra_body={"method": "none"}, **greedy)
        assert after.model_extra["pyspec"]["head_version"] >= 2
        assert after.choices[0].text == plain.choices[0].text
    finally:
        assert proc.stop() == 0, proc.log()


def test_server_online_without_draft_or_head_is_refused(tiny_target: str) -> None:
    from pyspec.server.online import OnlineLoop, OnlineSettings

    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1) as engine:
        with pytest.raises(ValueError, match="--draft or --head"):
            OnlineLoop(engine, OnlineSettings())


# -- the head known for a target ----------------------------------------------------------------------


def test_an_engine_loads_the_head_known_for_its_target(tiny_target: str, head_files: dict[str, object],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Engine(target) without head= loads the head remembered for that target file (under any
    directory: the key is the file's name and size); head=False loads none; a remembered head that
    no longer loads is skipped with a warning, and one that was deleted is ignored."""
    import logging
    import shutil

    from pyspec.head.known import known_head, remember_head

    monkeypatch.setenv("PYSPEC_HEADS", str(tmp_path / "heads"))
    assert known_head(tiny_target) is None
    head = tmp_path / "head.gguf"
    shutil.copy(head_files["files"]["f32"], head)
    remember_head(tiny_target, head)
    copy = tmp_path / "elsewhere" / Path(tiny_target).name
    copy.parent.mkdir()
    shutil.copy(tiny_target, copy)
    for target in (tiny_target, str(copy)):
        with pyspec.Engine(target, n_ctx=512, n_threads=1) as engine:
            assert engine.head_path == str(head.resolve())
            r = engine.generate(PROMPTS[0], max_tokens=24, method="eagle")
            assert r.head_version == 1 and r.tokens == engine.generate(PROMPTS[0], max_tokens=24, method="none").tokens
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1, head=False) as engine:
        assert engine.head_path is None
    head.write_bytes(b"not a head")
    with caplog.at_level(logging.WARNING, logger="pyspec"), pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as engine:
        assert engine.head_path is None
    assert "does not load; starting without one" in caplog.text
    head.unlink()
    assert known_head(tiny_target) is None
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as engine:
        assert engine.head_path is None
    with pytest.raises(TypeError, match="head must be a path"):
        pyspec.Engine(tiny_target, n_ctx=512, n_threads=1, head=True)
