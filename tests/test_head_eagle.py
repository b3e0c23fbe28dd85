"""The EAGLE-class head: in PyTorch its all-steps-at-once forward is what drafting one token at a
time computes, padding is never attended to, and training on data made by the tiny target
improves held-out prediction and resumes only with the same settings; without attention it runs
in the engine (architecture eagle_head) with the PyTorch head's logits, and method "redrafter"
over it keeps greedy output identical and sampled output distributed as the target's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import pyspec
from pyspec import HeadFileError
from pyspec.head.eagle import EagleConfig, EagleHead, rope
from pyspec.head.eagle_train import build_windows, evaluate_windows, window_loss
from pyspec.head.gguf_io import export_head
from pyspec.head.train import TrainConfig, train_head
from test_greedy import PROMPTS
from test_head import KEPT, assert_quantized_logits_close, tiny_head_data
from test_sampling import check_first_two_tokens


def random_head(d: int = 16, n_head: int = 2, n_kept: int = 40, n_vocab: int = 60, seed: int = 0) -> EagleHead:
    gen = torch.Generator().manual_seed(seed)
    vocab = torch.randperm(n_vocab, generator=gen)[:n_kept]
    head = EagleHead(EagleConfig(n_embd=d, n_target_vocab=n_vocab, n_head=n_head, n_ff=24),
                     vocab, torch.randn(n_kept + 1, d, generator=gen), torch.randn(n_kept, d, generator=gen))
    torch.manual_seed(seed)
    for p in head.parameters():  # away from the near-identity start, so every path matters
        p.data.add_(0.3 * torch.randn_like(p))
    return head.eval()


def draft_one_by_one(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """Reference: what generation computes, one anchor and one step at a time. The head's cache
    holds one entry (key, value at a position) per committed anchor j <= t, made from the
    target's feature f_j and token x_{j+1}; step k of anchor t adds its own entry at position
    t + k - 1 and attends over the cache plus the entries of its earlier steps."""
    cfg = head.config
    d = cfg.n_embd
    hd = d // cfg.n_head
    t_len = features.shape[0]

    def entry(g: torch.Tensor, token: int, pos: int):
        z = head.w_in(torch.cat([g, head.embedding[head.row_of[token]]]))
        h = head.attn_norm(z)
        split = lambda w: w(h).view(cfg.n_head, 1, hd)  # noqa: E731
        p = torch.tensor([pos])
        return z, rope(split(head.wq), p, cfg.rope_base), rope(split(head.wk), p, cfg.rope_base), split(head.wv)

    cache = [entry(features[j], int(tokens[j, 0]), j) for j in range(t_len)]
    out = torch.zeros(t_len, depth, head.n_kept)
    for t in range(t_len):
        g = features[t]
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k in range(depth):
            z, q, key, val = cache[t] if k == 0 else entry(g, int(tokens[t, k]), t + k)
            if k > 0:
                own.append((key, val))
            keys = [c[2] for c in cache[: t + 1]] + [kk for kk, _ in own]
            vals = [c[3] for c in cache[: t + 1]] + [vv for _, vv in own]
            scores = torch.cat([(q * kk).sum(-1) for kk in keys], dim=-1) / math.sqrt(hd)  # [H, n]
            probs = torch.softmax(scores, dim=-1)
            mixed = sum(probs[:, i, None, None] * vv for i, vv in enumerate(vals))        # [H, 1, hd]
            a = z + head.wo(mixed.reshape(d))
            hh = head.ff_norm(a)
            g = head.out_norm(a + head.w_down(F.silu(head.w_gate(hh)) * head.w_up(hh)))
            out[t, k] = g @ head.output_rows().T
    return out


def test_all_steps_at_once_equal_drafting_one_token_at_a_time() -> None:
    head = random_head()
    torch.manual_seed(1)
    t_len, depth = 7, 4
    features = torch.randn(1, t_len, 16)
    tokens = torch.randint(0, 60, (1, t_len, depth))
    with torch.no_grad():
        logits, _ = head(features, tokens, depth)
        reference = draft_one_by_one(head, features[0], tokens[0], depth)
    assert torch.allclose(logits[0], reference, atol=1e-4), (logits[0] - reference).abs().max()


def test_padding_is_never_attended_to() -> None:
    head = random_head(seed=2)
    torch.manual_seed(3)
    features = torch.randn(1, 5, 16)
    tokens = torch.randint(0, 60, (1, 5, 3))
    padded_f = torch.cat([features, 100 * torch.randn(1, 3, 16)], dim=1)
    padded_t = torch.cat([tokens, torch.randint(0, 60, (1, 3, 3))], dim=1)
    valid = torch.tensor([[True] * 5 + [False] * 3])
    with torch.no_grad():
        alone, _ = head(features, tokens, 3)
        padded, _ = head(padded_f, padded_t, 3, valid)
        unmasked, _ = head(padded_f, padded_t, 3)
    assert torch.allclose(alone, padded[:, :5], atol=1e-5)
    # Anchors after the padding would see it without the mask; anchors before never do (causal).
    assert torch.allclose(alone, unmasked[:, :5], atol=1e-5)


@pytest.fixture(scope="module")
def eagle_data(tmp_path_factory: pytest.TempPathFactory, tiny_target: str) -> dict[str, object]:
    data = tiny_head_data(tiny_target, tmp_path_factory.mktemp("eagle"))
    assert data["train"] and data["held"]
    return data


def new_eagle(data: dict[str, object], attention: bool = True) -> EagleHead:
    weights = data["weights"]
    torch.manual_seed(0)
    return EagleHead(EagleConfig(n_embd=weights.info.n_embd, n_target_vocab=weights.info.n_vocab, n_head=4, n_ff=128,
                                 attention=attention),
                     torch.from_numpy(data["vocab"]), torch.from_numpy(weights.embedding),
                     None if weights.output is None else torch.from_numpy(weights.output))


def test_windows_cover_every_row_once(eagle_data: dict[str, object]) -> None:
    win = build_windows(eagle_data["train"], eagle_data["column_of"], depth=3, width=16)
    assert win.n_anchors == sum(s.n_rows for s in eagle_data["train"])
    b = win.batch(np.arange(win.n))
    # Where a target row exists it is the anchor's row + k, in the same sequence.
    rows = win.starts[:, None] + np.arange(16)
    target = b["target"].numpy()
    exists = b["exists"].numpy()
    for k in range(3):
        assert (target[..., k][exists[..., k]] == (rows + k + 1)[exists[..., k]]).all()
    # Every row but a sequence's last has a step-1 target.
    assert exists[..., 0].sum() == win.n_anchors - len(eagle_data["train"])


def test_training_improves_held_out_prediction_and_resumes(eagle_data: dict[str, object], tmp_path: Path) -> None:
    column_of = eagle_data["column_of"]
    train = build_windows(eagle_data["train"], column_of, depth=3, width=16)
    held = build_windows(eagle_data["held"], column_of, depth=3)
    head = new_eagle(eagle_data)
    before = evaluate_windows(head, held)
    settings = {"arch": "eagle", "feature_weight": 0.1}
    config = TrainConfig(depth=3, epochs=8, batch_size=8, lr=3e-3, eval_every=10**6)
    loss_fn = lambda h, w, idx: window_loss(h, w, idx, 0.1)  # noqa: E731
    state = train_head(head, train, held, config, tmp_path / "run", loss_fn=loss_fn, eval_fn=evaluate_windows,
                       settings=settings)
    after = state.history[-1]
    assert state.finished
    assert after["loss"] < before["loss"] - 1.0, (before, after)
    assert after["acc"][0] > before["acc"][0] + 0.2, (before, after)
    assert after["chain"][1] > before["chain"][1]
    # The checkpoint carries the head's settings: other settings are refused, the same ones
    # resume (here: nothing left to do, the weights come back as trained).
    with pytest.raises(ValueError, match="other settings"):
        train_head(new_eagle(eagle_data), train, held, config, tmp_path / "run", loss_fn=loss_fn,
                   eval_fn=evaluate_windows, settings={"arch": "eagle", "feature_weight": 0.5})
    again = new_eagle(eagle_data)
    train_head(again, train, held, config, tmp_path / "run", loss_fn=loss_fn, eval_fn=evaluate_windows,
               settings=settings)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_without_attention_each_anchor_drafts_alone() -> None:
    head = random_head(seed=4)
    plain = EagleHead(EagleConfig(n_embd=16, n_target_vocab=60, n_head=2, n_ff=24, attention=False),
                      head.vocab, head.embedding, head.output)
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if k in plain.state_dict()})
    torch.manual_seed(5)
    features = torch.randn(1, 6, 16)
    tokens = torch.randint(0, 60, (1, 6, 3))
    with torch.no_grad():
        together, _ = plain(features, tokens, 3)
        alone = torch.cat([plain(features[:, t:t + 1], tokens[:, t:t + 1], 3)[0] for t in range(6)], dim=1)
        with_attention, _ = head(features, tokens, 3)
    assert torch.allclose(together, alone, atol=1e-5)
    assert not torch.allclose(together, with_attention, atol=1e-3)  # the attention block is really gone


def test_autocast_casts_the_frozen_output_rows_once_a_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    # Training under bf16 autocast casts the frozen output rows once a forward rather than at
    # every draft step's product: the same logits, bit for bit, for both kinds of head.
    import pyspec.head.eagle as eagle_module
    import pyspec.head.model as model_module
    from pyspec.head.model import HeadConfig, RecurrentHead

    eagle = random_head(seed=7)
    recurrent = RecurrentHead(HeadConfig(n_embd=16, n_target_vocab=60), eagle.vocab, eagle.embedding,
                              eagle.output).eval()
    torch.manual_seed(8)
    features = torch.randn(2, 5, 16)
    tokens = eagle.vocab[torch.randint(0, 40, (2, 5, 3))]

    def logits() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return eagle(features, tokens, 3)[0], recurrent(features[:, 0], tokens[:, 0])

    once = logits()
    monkeypatch.setattr(eagle_module, "autocast_frozen", lambda rows: rows)
    monkeypatch.setattr(model_module, "autocast_frozen", lambda rows: rows)
    every_step = logits()
    assert once[0].dtype == torch.bfloat16 and once[1].dtype == torch.bfloat16
    assert torch.equal(once[0], every_step[0]) and torch.equal(once[1], every_step[1])


def test_a_head_without_attention_evaluates_alike_on_rows_and_whole_sequences(eagle_data: dict[str, object]) -> None:
    # Held-out evaluation of a head without attention runs row by row (no window padded to the
    # longest sequence): the same anchors, the same figures as whole-sequence windows.
    head = new_eagle(eagle_data, attention=False)
    held = eagle_data["held"]
    whole = evaluate_windows(head, build_windows(held, eagle_data["column_of"], depth=3))
    rows = build_windows(held, eagle_data["column_of"], depth=3, width=1)
    assert rows.width == 1 and rows.n == rows.n_anchors == sum(s.n_rows for s in held)
    by_row = evaluate_windows(head, rows)
    assert by_row["acc"] == whole["acc"] and by_row["chain"] == whole["chain"]
    assert by_row["loss"] == pytest.approx(whole["loss"], rel=1e-4)


@pytest.fixture(scope="module")
def native(eagle_data: dict[str, object], tiny_target: str) -> dict[str, object]:
    """An EAGLE-class head without attention, untrained and trained, exported in f32 and q8_0,
    and an engine serving the trained f32 one."""
    work = eagle_data["work"]
    column_of = eagle_data["column_of"]
    head = new_eagle(eagle_data, attention=False)
    info = eagle_data["weights"].info
    files = {"untrained": work / "eagle-untrained.gguf", "f32": work / "eagle-f32.gguf", "q8_0": work / "eagle-q8.gguf"}
    export_head(head, info, files["untrained"], dtype="f32")
    train_head(head, build_windows(eagle_data["train"], column_of, depth=3, width=16), None,
               TrainConfig(depth=3, epochs=8, batch_size=8, lr=3e-3, eval_every=10**6), work / "eagle-mlp",
               loss_fn=lambda h, w, idx: window_loss(h, w, idx, 0.1), eval_fn=evaluate_windows,
               settings={"attention": False})
    export_head(head, info, files["f32"], dtype="f32")
    export_head(head, info, files["q8_0"], dtype="q8_0")
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2, head=str(files["f32"])) as engine:
        yield {"head": head.eval(), "files": {k: str(v) for k, v in files.items()}, "engine": engine}


def test_only_heads_without_attention_are_exported(eagle_data: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without attention"):
        export_head(new_eagle(eagle_data), eagle_data["weights"].info, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("dtype,atol", [("f32", 1e-4), ("q8_0", None)])
def test_engine_eagle_head_equals_pytorch_head(native: dict[str, object], dtype: str, atol) -> None:
    """Golden logits: three steps from the target's real hidden states through the PyTorch head
    and the engine's ggml graph; f32 agrees to float rounding, q8_0 within its rounding with any
    top-token flip on a near-tie."""
    engine, head = native["engine"], native["head"]
    core = engine._core.load_head(native["files"][dtype])
    assert core.kind == "eagle" and core.n_res_layers == 0
    tokens = engine.tokenize(PROMPTS[2])
    _, hidden = engine.evaluate_hidden(tokens)
    n = hidden.shape[0]
    state = core.initial_state(hidden)
    np.testing.assert_array_equal(state, hidden)  # an EAGLE head starts from the target's feature
    steps = [tokens[k:] + tokens[:k] for k in range(3)]  # different previous tokens each step
    with torch.no_grad():
        ref, feats = head(torch.from_numpy(hidden)[:, None], torch.tensor(steps).T[:, None, :], 3)
    for k in range(3):
        logits, state = core.step(hidden, state, [core.row_of(t) for t in steps[k]])
        want = ref[:, 0, k].numpy()
        assert logits.shape == want.shape == (n, KEPT)
        if atol is not None:
            np.testing.assert_allclose(logits, want, atol=atol)
            np.testing.assert_allclose(state, feats[:, 0, k].numpy(), atol=atol)
        else:
            assert_quantized_logits_close(logits, want)
            state = feats[:, 0, k].numpy().astype(np.float32)  # keep the q8_0 run on the reference path


def test_eagle_head_gguf_round_trip_and_online_rows(native: dict[str, object]) -> None:
    # load_head reads an EAGLE-class head file back as the EagleHead it was (for --init-from and
    # online fine-tuning), and the online trainer's first-step rows are its forward pass's.
    from pyspec.head.gguf_io import load_head
    from pyspec.head.online import HeadDraft
    from pyspec.online.config import DistillConfig
    from pyspec.online.buffer import TraceSample

    head = native["head"]
    loaded, info = load_head(native["files"]["f32"])
    assert isinstance(loaded, EagleHead) and not loaded.config.attention
    assert loaded.config.n_ff == head.config.n_ff and info.n_vocab == head.config.n_target_vocab
    for (name, a), (_, b) in zip(sorted(head.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), name
    quantized, _ = load_head(native["files"]["q8_0"])
    assert torch.allclose(quantized.w_gate.weight, head.w_gate.weight, atol=0.02)
    draft = HeadDraft(native["files"]["f32"], DistillConfig())
    assert draft.vocab_parameters() == []
    torch.manual_seed(3)
    d = head.config.n_embd
    tokens = head.vocab[torch.randint(0, head.n_kept, (6,))].numpy().astype(np.int32)
    hidden = torch.randn(3, d).numpy()
    sample = TraceSample(tokens=tokens, rows=np.array([0, 2, 4], dtype=np.int32), top_ids=np.zeros((3, 1), np.int32),
                         top_probs=np.ones((3, 1), np.float32), hidden=hidden)
    full = draft.row_logits(sample)
    with torch.no_grad():
        kept = head(torch.from_numpy(hidden)[:, None], torch.from_numpy(tokens[[0, 2, 4]].astype(np.int64))[:, None, None],
                    1)[0][:, 0, 0]
    assert full.shape == (3, head.config.n_target_vocab)
    assert torch.allclose(full[:, head.vocab], kept, atol=1e-5)


def test_online_head_steps_are_the_heads_own_steps(native: dict[str, object]) -> None:
    """DistillConfig(head_depth=k): the online trainer's step j logits at row r are what the
    head drafts at step j from the hidden state of row r - 1 and the real tokens r .. r + j - 1
    (a loop one step at a time), learnt against row r + j - 1's target distribution, for the
    rows whose next j - 1 rows are in the sample; head_depth 1 is the first step alone."""
    from pyspec.head.online import HeadDraft
    from pyspec.online.buffer import TraceSample
    from pyspec.online.config import DistillConfig

    head = native["head"]
    torch.manual_seed(5)
    tokens = head.vocab[torch.randint(0, head.n_kept, (10,))].numpy().astype(np.int32)
    rows = np.array([1, 2, 3, 4, 6, 7], dtype=np.int32)  # row 5 missing: chains through it stop
    hidden = torch.randn(len(rows), head.config.n_embd).numpy()
    sample = TraceSample(tokens=tokens, rows=rows, top_ids=np.arange(len(rows), dtype=np.int32)[:, None],
                         top_probs=np.ones((len(rows), 1), np.float32), hidden=hidden)
    first = HeadDraft(native["files"]["f32"], DistillConfig())
    [(only, at)] = first.step_logits(sample)
    assert at is None and torch.equal(only, first.row_logits(sample))
    draft = HeadDraft(native["files"]["f32"], DistillConfig(head_depth=3))
    parts = draft.step_logits(sample)
    expected_rows = [[1, 2, 3, 4, 6, 7], [1, 2, 3, 6], [1, 2]]
    assert len(parts) == 3
    with torch.no_grad():
        for j, ((logits, teacher), anchors) in enumerate(zip(parts, expected_rows)):
            assert list(rows[teacher]) == [r + j for r in anchors]  # the distribution of row r + j
            assert logits.shape == (len(anchors), head.config.n_target_vocab)
            for i, r in enumerate(anchors):
                g = torch.from_numpy(hidden[list(rows).index(r)])
                for k in range(j + 1):  # one step at a time, from the real token r + k
                    z = head.w_in(torch.cat([g, head.embedding[head.row_of[int(tokens[r + k])]]]))
                    g = head.out_norm(head._mlp(z))
                assert torch.allclose(logits[i, head.vocab], g @ head.output_rows().T, atol=1e-4)
    with pytest.raises(ValueError, match="head_depth"):
        DistillConfig(head_depth=0)


@pytest.mark.parametrize("head_depth", [1, 3])
def test_online_fine_tuning_of_an_eagle_head(tiny_target: str, native: dict[str, object], head_depth: int) -> None:
    """HeadDistiller fine-tunes an EAGLE-class head as it does the recurrent one: an update
    trains its first step (head_depth 1) or its first three steps in the training process, the
    new head is reloaded, outputs stay the target's."""
    from pyspec.head.online import HeadDistiller
    from pyspec.online.config import DistillConfig

    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=1, head=native["files"]["untrained"]) as engine:
        distiller = HeadDistiller(engine, DistillConfig(lr=3e-3, positions="all", epochs=4, train_threads=1,
                                                        export_dtype="f32", head_depth=head_depth),
                                  update_interval=100)
        try:
            before = [distiller.generate(p, max_tokens=32) for p in PROMPTS[:3]]
            assert all(r.head_version == 1 for r in before)
            assert distiller.update_now(wait=True, timeout=300), distiller.stats().last_error
            stats = distiller.stats()
            assert stats.draft_version == engine.head_version == 2 and stats.n_updates == 1
            assert stats.last_report.loss_after < stats.last_report.loss_before
            assert engine._core.load_head(engine.head_path).kind == "eagle"
            for p in PROMPTS[:3]:
                r = distiller.generate(p, max_tokens=32)
                assert r.head_version == 2
                assert r.tokens == engine.generate(p, max_tokens=32, method="none").tokens
        finally:
            distiller.close()


def test_stream_experiment_fine_tunes_the_head(tiny_target: str, native: dict[str, object], tmp_path: Path) -> None:
    """benchmarks/online_stream.py --head: the static mode serves the starting head throughout,
    the online mode serves the heads its updates made (versions rising), windows of the stream
    are reported, and the held-out prompts are served with plain decoding and each mode's final
    head, with greedy outputs equal to plain decoding's."""
    import json

    from test_online_stream_log import load_script

    out = tmp_path / "stream.json"
    script = load_script()
    assert script.main(["--target", tiny_target, "--head", native["files"]["untrained"], "--raw",
                        "--stream", "humaneval:6", "--heldout", "2", "--modes", "static,online", "--window", "3",
                        "--update-interval", "3", "--wait-updates", "--positions", "all", "--teacher", "evaluate",
                        "--lr", "3e-3", "--epochs", "4", "--export-dtype", "f32", "--max-tokens", "16",
                        "--n-draft", "3", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    runs = {run["mode"]: run for run in report["runs"]}
    assert [r["draft_version"] for r in runs["static"]["records"]] == [1] * 6
    online = [r["draft_version"] for r in runs["online"]["records"]]
    assert online[:3] == [1, 1, 1] and online[3:] == [2, 2, 2], online  # one update after 3 requests
    assert runs["online"]["updates"][""]["n_failed_updates"] == 0
    assert all(a["tokens"] == b["tokens"] for a, b in zip(runs["static"]["records"], runs["online"]["records"]))
    for mode in ("static", "online"):
        windows = report["summary"][mode]["windows"]
        assert [(w["first"], w["last"]) for w in windows] == [(0, 2), (3, 5)]
        assert all(w["tokens_per_target_call"] >= 1.0 for w in windows)
        assert all(0.0 <= w["acceptance_by_depth"][0] <= 1.0 for w in windows)
    held = report["summary"]["heldout"]["summary"]["all"]
    assert held["n_prompts"] == 2
    for mode in ("static", "online"):
        assert held[mode]["identical_to_none"] == 2
        m = held[mode]
        assert m["flat_curve_speedup"] == pytest.approx(
            m["tokens_per_target_call"] * held["none_ms_per_call"] / (held["none_ms_per_call"] + m["draft_ms_per_call"]))
        assert held[mode]["acceptance_by_depth"] and all(0.0 <= a <= 1.0 for a in held[mode]["acceptance_by_depth"]
                                                          if a is not None)
    assert report["heldout"]["rows"][0]["online"]["n_drafted"] > 0


def test_acceptance_by_depth_of_pooled_chains() -> None:
    """Depth k: among the steps that accepted at least k - 1 tokens, the share that accepted k."""
    from test_online_stream_log import load_script

    script = load_script()
    runs = [{"accept_histogram": [2, 1, 1], "n_empty_drafts": 0},  # steps that accepted 0, 1, 2, (3)
            {"accept_histogram": [0, 1, 0, 0], "n_empty_drafts": 0}]
    assert script.acceptance_by_depth(runs) == [3 / 5, 1 / 3, 0.0]
    runs[0]["n_empty_drafts"] = 1  # a step that drafted nothing is no rejection at depth 1
    assert script.acceptance_by_depth(runs) == [3 / 4, 1 / 3, 0.0]
    assert script.acceptance_by_depth([{"accept_histogram": [4], "n_empty_drafts": 4}]) == []


@pytest.mark.parametrize("beams,length", [(1, 5), (4, 5)])
def test_eagle_head_greedy_equals_plain(native: dict[str, object], beams: int, length: int) -> None:
    engine = native["engine"]
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=48, method="none")
        spec = engine.generate(prompt, max_tokens=48, method="redrafter", beams=beams, beam_length=length)
        assert spec.tokens == plain.tokens, (beams, length, prompt)
        s = spec.stats
        assert s.n_generated == s.n_accepted + s.n_target_calls


def test_eagle_tree_over_the_eagle_head_equals_plain(native: dict[str, object]) -> None:
    """Method "eagle" (EAGLE-2's dynamic tree) over an EAGLE-class head: each candidate is
    stepped from its parent's predicted feature."""
    engine = native["engine"]
    engine.reload_head(native["files"]["f32"])
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=48, method="none")
        spec = engine.generate(prompt, max_tokens=48, method="eagle", tree_nodes=12, tree_depth=5, tree_branching=3,
                               tree_expand=3)
        assert spec.tokens == plain.tokens, prompt
        assert spec.stats.n_head_drafts > 0 and spec.stats.n_accepted > 0


def test_engine_drafts_with_what_the_eagle_head_learned(native: dict[str, object]) -> None:
    engine = native["engine"]
    rates = {}
    for name in ("untrained", "f32"):
        engine.reload_head(native["files"][name])
        r = engine.generate(PROMPTS[0], max_tokens=64, method="redrafter", beams=2, beam_length=4)
        rates[name] = r.stats.acceptance_rate
    assert rates["f32"] > rates["untrained"] + 0.1, rates


@pytest.mark.parametrize("method, options", [("redrafter", dict(beams=2, beam_length=3)),
                                             ("eagle", dict(tree_nodes=8, tree_depth=3, tree_branching=2))])
def test_eagle_head_samples_target_distribution(native: dict[str, object], method: str,
                                               options: dict[str, int]) -> None:
    # Sampling through the EAGLE-class head's beams and its EAGLE-2 trees follows the target's
    # distribution (chi-square of the first two tokens), with head tokens accepted.
    engine = native["engine"]
    engine.reload_head(native["files"]["f32"])
    prompt = engine.tokenize(PROMPTS[0])
    _, _, n_accepted, _ = check_first_two_tokens(engine, prompt, method=method, **options)
    assert n_accepted > 0


def test_a_broken_eagle_head_keeps_the_old_one(native: dict[str, object], eagle_data: dict[str, object],
                                                tmp_path: Path) -> None:
    """A head file without its MLP's width, or with a misshapen tensor, is refused by name and
    the head serving before it keeps serving."""
    import gguf
    engine = native["engine"]
    engine.reload_head(native["files"]["f32"])
    reader = gguf.GGUFReader(native["files"]["f32"])
    for drop_key, bad_tensor, message in (("eagle_head.feed_forward_length", None, "feed_forward_length missing"),
                                          (None, "head.w_up.weight", "head.w_up.weight is")):
        path = tmp_path / "broken.gguf"
        writer = gguf.GGUFWriter(str(path), "eagle_head")
        for name, field in reader.fields.items():
            if name.startswith("eagle_head.") and name != drop_key:
                value = field.contents()
                if isinstance(value, bool):
                    writer.add_bool(name, value)
                elif isinstance(value, str):
                    writer.add_string(name, value)
                elif isinstance(value, float):
                    writer.add_float32(name, value)
                else:
                    writer.add_uint32(name, int(value))
        for t in reader.tensors:
            data = np.array(t.data)
            if t.name == bad_tensor:
                data = data[:-1]  # one row short
            writer.add_tensor(t.name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(HeadFileError, match=message):
            engine.reload_head(str(path))
        assert engine.head_path == native["files"]["f32"]
        r = engine.generate(PROMPTS[1], max_tokens=24, method="redrafter", beams=2, beam_length=3)
        assert r.tokens == engine.generate(PROMPTS[1], max_tokens=24, method="none").tokens


def test_train_head_command_trains_an_eagle_head_the_engine_runs(tmp_path: Path, tiny_target: str) -> None:
    """`pyspec train-head --arch eagle`: data (stopped by --time-budget after one sequence, then
    the rest), training, the held-out report, an `eagle_head` GGUF that `pyspec generate --head`
    drafts with."""
    import json

    from test_cli import pyspec_cli

    args = ["train-head", "--arch", "eagle", "--ff", "96", "--window", "16", "--target", tiny_target,
            "--data", str(tmp_path / "data"), "--out", str(tmp_path / "e.gguf"), "--prompts", "humaneval[0:8]",
            "--max-tokens", "24", "--kept-vocab", "200", "--epochs", "4", "--depth", "3", "--batch-size", "4",
            "--eval-fraction", "0.25", "--dtype", "f32", "--threads", "2", "--no-remember", "--json"]
    partial = pyspec_cli(*args, "--time-budget", "0")   # data: one sequence only
    assert partial.returncode == 0, partial.stderr
    assert json.loads(partial.stdout)["total_steps"] is None and not (tmp_path / "e.gguf").exists()
    done = pyspec_cli(*args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["arch"] == "eagle" and report["step"] == report["total_steps"] > 1
    first, last = report["history"][0], report["history"][-1]
    assert last["loss"] < first["loss"] and len(last["acc"]) == 3
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2) as engine:
        assert engine._core.load_head(str(tmp_path / "e.gguf")).kind == "eagle"
    gen = pyspec_cli("generate", "--target", tiny_target, "--head", str(tmp_path / "e.gguf"), "--prompt", "def f():",
                     "--max-tokens", "16", "--method", "redrafter", "--beams", "2", "--json")
    assert gen.returncode == 0, gen.stderr
    plain = pyspec_cli("generate", "--target", tiny_target, "--prompt", "def f():", "--max-tokens", "16",
                       "--method", "none", "--json")
    assert json.loads(gen.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    # --init-from an EAGLE-class head: fine-tuning starts from its weights (held-out loss at step
    # 0 is the trained head's, not a new one's); --arch must not name the other kind.
    tuned = pyspec_cli(*args, "--init-from", str(tmp_path / "e.gguf"), "--work-dir", str(tmp_path / "w2"),
                       "--out", str(tmp_path / "e2.gguf"), "--epochs", "1")
    assert tuned.returncode == 0, tuned.stderr
    tuned_report = json.loads(tuned.stdout)
    assert tuned_report["init_from"] == str(tmp_path / "e.gguf") and tuned_report["arch"] == "eagle"
    assert tuned_report["history"][0]["loss"] < first["loss"] - 0.5 * (first["loss"] - last["loss"])
    wrong = [a for a in args if a not in ("--arch", "eagle")]
    refused = pyspec_cli(*wrong, "--arch", "redrafter", "--init-from", str(tmp_path / "e.gguf"),
                         "--work-dir", str(tmp_path / "w3"))
    assert refused.returncode == 1 and "is a head of kind eagle, not --arch redrafter" in refused.stderr
