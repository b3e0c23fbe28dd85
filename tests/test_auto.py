"""method="auto": the scheduler's choices follow the cost curves, its output stays the target's,
and cost curves are measured, cached and reloaded per model, threads and backend."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import _core, calibration
from invariants import layout_tokens_by_piece

PROMPTS = [
    "def hello():\n    return",
    "The quick brown fox",
    "import numpy as np\n\nclass Model:\n    def __init__(self):",
    "a b c a b c a b c a b c",
]


def flat(ms: float) -> pyspec.CostCurve:
    """A curve where verifying up to 64 tokens costs as much as one."""
    return pyspec.CostCurve((1, 64), (ms, ms))


def linear(ms: float) -> pyspec.CostCurve:
    """A curve where k tokens cost k times one: verification never pays."""
    return pyspec.CostCurve((1, 64), (ms, 64 * ms))


def install(engine: pyspec.Engine, target: pyspec.CostCurve, draft: pyspec.CostCurve | None = None) -> None:
    """Installs synthetic cost curves. Tests that plan with them pass auto_adapt_costs=False:
    otherwise the engine corrects the curves from the real step times within a few steps."""
    engine._core.set_cost(False, target._core(), "")
    if draft is not None:
        engine._core.set_cost(True, draft._core(), "")


@pytest.fixture()
def engine(tiny_target: str, tiny_drafts: dict[str, str]):
    """A private engine (the tests install their own cost curves), identical draft."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts["identical"], n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.mark.parametrize("kind", ["identical", "independent", "perturbed"])
def test_auto_greedy_equals_plain(engines, kind: str) -> None:
    engine = engines[kind]
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=48, method="none")
        auto = engine.generate(prompt, max_tokens=48)  # auto is the default
        assert auto.method == "auto"
        assert auto.tokens == plain.tokens, (kind, prompt)
        s = auto.stats
        assert s.n_target_calls == s.n_empty_drafts + sum(1 for i in range(auto.trace.n_steps)
                                                          if len(auto.trace.drafted(i)) > 0)
        assert s.n_generated == len(auto.tokens)


@pytest.mark.parametrize("kind", ["identical", "independent", "perturbed"])
def test_auto_greedy_equals_plain_when_it_drafts(tiny_target: str, tiny_drafts: dict[str, str], kind: str) -> None:
    """The same identity on curves where drafting pays (a flat target curve, a draft 100x
    cheaper), so that auto drafts at almost every step: identity holds with drafts accepted and
    rejected, not only because auto decoded plainly."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts[kind], n_ctx=1024, n_threads=2) as engine:
        install(engine, flat(10.0), flat(0.1))
        drafted = accepted = rejected = 0
        for prompt in PROMPTS:
            plain = engine.generate(prompt, max_tokens=48, method="none")
            auto = engine.generate(prompt, max_tokens=48, auto_adapt_costs=False)
            assert auto.tokens == plain.tokens, (kind, prompt)
            drafted += auto.stats.n_drafted
            accepted += auto.stats.n_accepted
            rejected += auto.stats.n_drafted - auto.stats.n_accepted
    assert drafted > 0 and accepted > 0, (kind, drafted, accepted)
    if kind != "identical":
        assert rejected > 0, (kind, drafted, accepted)


def test_linear_cost_means_plain_decoding(engine: pyspec.Engine) -> None:
    """When k tokens cost k times one token, no proposal can pay: every step is plain decoding."""
    install(engine, linear(10.0), linear(1.0))
    r = engine.generate(PROMPTS[3], max_tokens=40, auto_adapt_costs=False)
    assert r.stats.n_target_calls == r.stats.n_empty_drafts == 40
    assert r.stats.n_drafted == 0 and r.stats.n_draft_decodes == 0
    assert r.tokens == engine.generate(PROMPTS[3], max_tokens=40, method="none").tokens


def test_free_verification_and_cheap_draft_use_the_draft_model(engine: pyspec.Engine) -> None:
    """A flat target curve and a draft 100x cheaper than the target: draft-model chains pay, the
    (identical) draft is always right, and auto drafts long chains with it."""
    install(engine, flat(10.0), flat(0.1))
    r = engine.generate(PROMPTS[1], max_tokens=48, auto_max_gamma=6, auto_adapt_costs=False)
    assert r.tokens == engine.generate(PROMPTS[1], max_tokens=48, method="none").tokens
    assert r.stats.n_draft_decodes > 0
    assert r.stats.acceptance_rate == 1.0
    assert r.stats.tokens_per_target_call > 4
    assert r.draft_version == 1
    # Told not to use the draft model, it does not.
    r2 = engine.generate(PROMPTS[1], max_tokens=48, auto_draft_model=False, auto_adapt_costs=False)
    assert r2.stats.n_draft_decodes == 0 and r2.draft_version == 0


def test_dear_draft_model_is_not_used(engine: pyspec.Engine) -> None:
    """A draft token that costs as much as a target token never pays, even when always right."""
    install(engine, flat(10.0), flat(10.0))
    r = engine.generate(PROMPTS[0], max_tokens=40, auto_adapt_costs=False)
    assert r.stats.n_draft_decodes == 0


def test_draft_model_that_reads_the_prompt_slowly_is_not_started(engine: pyspec.Engine) -> None:
    """The draft's first chain in a request reads the whole prompt into its cache. A draft whose
    decodes are cheap but whose prompt reading is dear (20 ms per token here, a 12-token prompt) is
    not started, although each of its draft tokens alone would pay: the same call with the same
    one-token cost and cheap reading, flat(0.1), drafts long chains
    (test_free_verification_and_cheap_draft_use_the_draft_model)."""
    install(engine, flat(10.0), pyspec.CostCurve((1, 64), (0.1, 1280.0)))
    r = engine.generate(PROMPTS[1], max_tokens=48, auto_max_gamma=6, auto_adapt_costs=False)
    assert r.stats.n_draft_decodes == 0


def test_repetitive_text_is_drafted_from_lookup(tiny_target: str) -> None:
    """No draft model: on a flat curve the lookup proposal pays once the output repeats itself."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2) as engine:
        install(engine, flat(10.0))
        plain = engine.generate(PROMPTS[3], max_tokens=64, method="none")
        r = engine.generate(PROMPTS[3], max_tokens=64, auto_adapt_costs=False)
        assert r.tokens == plain.tokens
        assert r.stats.n_draft_decodes == 0 and r.draft_version == 0
        # The tiny target's greedy output falls into a loop; lookup then proposes it.
        assert r.stats.n_accepted > 0 and r.stats.n_target_calls < 64


def test_sampled_auto_with_a_seed_is_reproducible(engine: pyspec.Engine) -> None:
    """Whatever the scheduler learned in between (and even where the draft model would pay), a
    seed gives the same tokens: seeded sampled requests draft only one-hot proposals."""
    install(engine, flat(10.0), flat(0.1))
    a = engine.generate(PROMPTS[0], max_tokens=40, temperature=0.9, seed=123, auto_adapt_costs=False)
    engine.generate(PROMPTS[3], max_tokens=40, temperature=0.9, auto_adapt_costs=False)  # more statistics, more phrases
    b = engine.generate(PROMPTS[0], max_tokens=40, temperature=0.9, seed=123, auto_adapt_costs=False)
    assert a.method == "auto" and a.tokens == b.tokens
    assert a.stats.n_draft_decodes == 0 and a.draft_version == 0


def test_deterministic_drafts_sample_what_plain_decoding_samples(engines) -> None:
    """One-hot proposals are verified with one draw per token, so for a seed the sampled output of
    lookup (and of auto without the draft model) is plain decoding's, token for token."""
    engine = engines["identical"]
    for seed in range(5):
        plain = engine.generate(PROMPTS[3], max_tokens=48, temperature=1.0, seed=seed, method="none")
        lookup = engine.generate(PROMPTS[3], max_tokens=48, temperature=1.0, seed=seed, method="lookup")
        auto = engine.generate(PROMPTS[3], max_tokens=48, temperature=1.0, seed=seed, auto_draft_model=False)
        assert lookup.tokens == plain.tokens, seed
        assert auto.tokens == plain.tokens, seed


def test_bad_auto_settings_are_named(engines) -> None:
    engine = engines["identical"]
    with pytest.raises(pyspec.InvalidArgumentError, match="auto max_nodes"):
        engine.generate("x", max_tokens=4, auto_max_nodes=0)
    with pytest.raises(pyspec.InvalidArgumentError, match="auto max_depth"):
        engine.generate("x", max_tokens=4, auto_max_depth=0)
    with pytest.raises(pyspec.InvalidArgumentError, match="increase strictly"):
        pyspec.CostCurve((1, 1), (1.0, 2.0))._core()


# -- calibration ------------------------------------------------------------------------------


def test_measured_curve_is_sane(engine: pyspec.Engine) -> None:
    curves = engine.calibrate(force=True, repeats=2, progress=False)
    assert set(curves) == {"target", "draft"}
    for c in curves.values():
        assert c.n_tokens == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
        assert all(t > 0 for t in c.ms)
        assert list(c.ms) == sorted(c.ms)  # made monotone
    # Installed in the engine.
    assert tuple(engine._core.cost(False, "").ms) == curves["target"].ms


def test_curves_are_cached_and_reloaded(tiny_target: str, tiny_drafts: dict[str, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path))
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=512, n_threads=2) as e:
        first = e.calibrate(repeats=1, progress=False)
        key = calibration.cache_key(e, None)
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2
    stored = json.loads(calibration.cache_file(key).read_text())
    assert stored["key"] == key and tuple(stored["ms"]) == first["target"].ms

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although a cached curve exists")

    monkeypatch.setattr(calibration, "measure", no_measuring)
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=512, n_threads=2) as e:
        assert e.calibrate(progress=False) == first
        # method auto picks the cached curves up by itself.
        assert e.generate("x", max_tokens=4).method == "auto"
    # Another thread count is another key: measured again.
    monkeypatch.undo()
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path))
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as e:
        e.calibrate(repeats=1, progress=False)
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_corrupt_cache_file_is_measured_again(tiny_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path))
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as e:
        e.calibrate(repeats=1, progress=False)
        path = calibration.cache_file(calibration.cache_key(e, None))
    path.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="pyspec"), pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as e:
        curve = e.calibrate(repeats=1, progress=False)["target"]
    assert "unreadable calibration file" in caplog.text
    assert json.loads(path.read_text())["ms"] == list(curve.ms)


def test_calibrate_cli_prints_curves(tiny_target: str, tmp_path: Path) -> None:
    from test_cli import pyspec_cli

    env_dir = os.environ.get(calibration.DIR_ENV)
    assert env_dir  # conftest keeps test curves out of the user's cache
    p = pyspec_cli("calibrate", "--target", tiny_target, "--draft", "", "--repeats", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"target", "flash_attn"} and out["target"]["n_tokens"][0] == 1
    assert out["flash_attn"] == {"on": False, "mode": "off"}  # forced off for the tests (conftest)
    table = pyspec_cli("calibrate", "--target", tiny_target, "--draft", "")
    assert table.returncode == 0 and "relative to k=1" in table.stdout


def test_a_reloaded_draft_gets_the_cost_of_its_own_file(engine: pyspec.Engine, tiny_drafts: dict[str, str],
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload drops the slot's curve: the new file's cost is looked up in the cache by what it
    is (tensor types and shapes), or measured; it is never the replaced file's curve."""
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path))
    install(engine, flat(10.0), flat(0.5))
    engine.reload_draft(tiny_drafts["perturbed"])  # same architecture and size: dropped all the same
    assert engine._core.cost(True, "").empty
    measured = []
    real_measure = calibration.measure

    def counting_measure(*args, **kwargs):
        measured.append(args[1])
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(calibration, "measure", counting_measure)
    f32_curve = calibration.ensure(engine, "", repeats=1, progress=False)
    assert measured == [""] and f32_curve.ms != (0.5, 0.5)
    # Another file of the same kind (f32, same shapes): found in the cache, not measured again.
    engine.reload_draft(tiny_drafts["independent"])
    assert calibration.ensure(engine, "", progress=False) == f32_curve and measured == [""]
    # The same weights in Q8_0: another kind of file, measured for itself.
    q8 = tmp_path / "perturbed-q8_0.gguf"
    _core.quantize_model(tiny_drafts["perturbed"], str(q8), 7, [])
    engine.reload_draft(str(q8))
    assert engine._core.cost(True, "").empty
    calibration.ensure(engine, "", repeats=1, progress=False)
    assert measured == ["", ""]
    assert calibration.cache_key(engine, "") != calibration.cache_key(engine, None)  # draft and target curves differ


def test_costs_correct_themselves(tiny_target: str) -> None:
    """A calibration far off (1000x too slow) is the prior only: every decoded step is timed and
    the model's estimate follows the real step time within a generation; sizes never decoded
    borrow the correction; a new calibration starts over."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2) as engine:
        assert engine.cost_model() is None
        install(engine, linear(1000.0))
        r = engine.generate(PROMPTS[1], max_tokens=40, method="none")
        state = engine.cost_model()
        assert state is not None and state.prior_ms[0] == 1000.0
        assert state.n_observed[0] == r.stats.n_target_calls == state.n_observed_total
        assert len(r.step_ms) == r.stats.n_target_calls and set(r.step_sizes) == {1}
        # The estimate is the calibration corrected by every step the generation timed, no other:
        # the same steps fed to a fresh CostModel (whose update rule tests/cpp/test_cost_model.cpp
        # checks) give the same estimate. Not a comparison with the recent step times: on a busy
        # machine stalled steps put their median far from the estimate, which believes a slow step
        # only up to 3x (seen once in a full run: median 125 ms against the estimate's 3.9 ms).
        replayed = pyspec._core.CostModel()
        replayed.set_prior(linear(1000.0)._core())
        for ms in r.step_ms:
            replayed.observe(1, float(ms))
        assert state.ms[0] == pytest.approx(replayed.at(1), rel=1e-5) and state.ms[0] < 100.0
        assert state.correction()[-1] == pytest.approx(state.correction()[0])  # k = 64: borrowed
        install(engine, linear(1000.0))
        assert engine.cost_model().n_observed_total == 0
        assert engine.cost_model().ms[0] == 1000.0


def test_what_auto_learnt_is_copied_and_put_back(tiny_target: str) -> None:
    """Engine._core.learnt() copies what auto learnt across requests (acceptance statistics, cost
    corrections) and restore_learnt() puts the copy back: the same request then plans exactly as
    it did from there, where without the copy it plans from what the earlier runs taught it."""
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=2) as engine:
        # verification cheap enough that lookup pays, dear enough that the statistics decide
        install(engine, pyspec.CostCurve((1, 2, 4, 8, 64), (10.0, 13.0, 19.0, 31.0, 400.0)))
        start = engine._core.learnt()
        assert start.n_observed_steps == 0

        def run() -> list[int]:
            engine.clear_pool()  # the phrase pool learns too; save_pool / load_pool keep it
            r = engine.generate(PROMPTS[3], max_tokens=64, auto_adapt_costs=False)
            return r.step_sizes.tolist()

        first = run()
        after_first = engine._core.learnt()
        assert after_first.n_observed_steps == len(first)
        second = run()
        assert second != first  # the statistics of the first run change the second's plan
        engine._core.restore_learnt(start)
        assert engine._core.learnt().n_observed_steps == 0
        assert run() == first
        engine._core.restore_learnt(after_first)
        assert run() == second
    with pytest.raises(pyspec.EngineClosedError):
        engine._core.learnt()


def test_planner_is_exposed_for_inspection() -> None:
    stats = _core.AcceptanceStats()
    plan = _core.plan_draft([-1, 0, 1], [], stats, [0.0, 100.0, 120.0, 140.0, 160.0], 0.0)
    assert list(plan.keep) == [0] and plan.expected_tokens == pytest.approx(1.5)


def test_kind_names() -> None:
    """The names auto_replay.py --by-kind prints, one per kind constructor (match lengths by bucket)."""
    assert _core.kind_name(_core.kind_lookup(4)) == "lookup m4"
    assert _core.kind_name(_core.kind_lookup(20)) == "lookup m17"
    assert _core.kind_name(_core.kind_pool(10)) == "pool m9"
    assert _core.kind_name(_core.kind_model(0.75)) == "model p0.7"
    assert _core.kind_name(_core.kind_lookup_contested()) == "contested"
    assert _core.kind_name(_core.kind_lookup_boundary(30)) == "lookup-boundary m25"
    assert _core.kind_name(_core.kind_lookup_substituted()) == "lookup-substituted"
    assert _core.kind_name(_core.kind_lookup_substituted_loose()) == "lookup-substituted-loose"
    assert _core.kind_name(_core.kind_lookup_fence()) == "lookup-fence"
    assert _core.kind_name(_core.kind_lookup_answer_start()) == "lookup-answer-start"
    assert _core.kind_name(_core.kind_head_alternative()) == "head-alternative"
    assert _core.kind_name(0) == "unknown" and _core.kind_name(300) == "unknown"


def _replay(prompt: list[int], output: list[int], curve: pyspec.CostCurve, stop_tokens: list[int] = (),
            adapt_costs: bool = True, pool: bool = True):
    params = pyspec.GenerationConfig(method="auto").to_core()
    params.pool.enabled = pool  # off: prompt lookup's proposals alone
    params.lookup.stop_tokens = list(stop_tokens)
    params.scheduler.adapt_costs = adapt_costs  # off: no probes of sizes the curve calls dear
    ((sizes, accepted, kinds),) = _core.replay_auto([(prompt, output)], curve._core(), params.lookup,
                                                    params.pool, params.scheduler)
    sizes, accepted = list(sizes), list(accepted)
    # A step's first kind: a node kind when it drafted, 0 (unknown) when it decoded plainly.
    assert all((k > 0) == (s > 1) for s, k in zip(sizes, kinds))
    # Every step commits its accepted tokens plus the target's own: the output, exactly.
    assert sum(a + 1 for a in accepted) == len(output)
    assert all(0 <= a <= s - 1 for s, a in zip(sizes, accepted))
    return sizes, accepted


# The quiet calibration of the Qwen 1.5B target on the 2-core development CPU (README, "Costs at a
# long context"): a decode of 64 tokens costs 22 one-token decodes, so only copies accepted with
# P above ~0.97 per token pay for drafting long.
CPU_CURVE = pyspec.CostCurve((1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
                             (35.2, 64.9, 84.0, 105.9, 160.5, 243.6, 316.2, 347.3, 457.8, 562.1, 679.9, 776.7))


def test_replay_a_first_long_copy_goes_by_in_long_steps() -> None:
    # A fresh engine (no statistics yet) whose output copies 90 tokens of its prompt: once the
    # copy has run 17 tokens its nodes have the measured long-copy prior (0.99 from 25 tokens),
    # and on the CPU curve the rest goes by in a few long steps. With the prior m / (m + 2) of
    # shorter matches (0.89-0.97) it went by in 3-token steps: 22 steps for the 90 tokens.
    quote = list(range(1000, 1100))
    prompt = [5, *quote, 6, 7]
    sizes, accepted = _replay(prompt, quote[:90] + list(range(300, 310)), CPU_CURVE, pool=False)
    starts = np.cumsum([0] + [n + 1 for n in accepted])[:-1]  # output position of each step
    assert sum(start < 90 for start in starts) <= 12, list(zip(sizes, accepted))
    assert max(accepted) >= 40


def test_replay_drafts_a_quoted_text_when_verification_is_cheap() -> None:
    # The prompt quotes 60 tokens between delimiters (900, 901); the output repeats the quote.
    quote = list(range(100, 160))
    prompt = [900, 5, 6, *quote, 901, 7]
    sizes, accepted = _replay(prompt, quote[:40] + [300, 301, 302], flat(10.0), stop_tokens=[900, 901])
    assert len(sizes) <= 8 and max(accepted) >= 20  # the copy goes by in a few long steps
    # With verification as dear as plain decoding, nothing is drafted.
    sizes, _ = _replay(prompt, quote[:40] + [300, 301, 302], linear(10.0), adapt_costs=False)
    assert set(sizes) == {1}


def test_replay_copies_stop_at_stop_tokens() -> None:
    # The prompt quotes 20 tokens, then a delimiter (901) and 40 tokens of template markup
    # (902-941) that the output, which repeats the quote and goes its own way, never follows.
    # Without stop tokens, the copy's drafts run on into the markup and are rejected there.
    quote = list(range(100, 120))
    prompt = [900, *quote, *range(901, 942)]
    output = quote + list(range(500, 540))
    with_stops, acc_stops = _replay(prompt, output, flat(10.0), stop_tokens=list(range(900, 942)))
    without, acc_without = _replay(prompt, output, flat(10.0))
    assert sum(acc_stops) == sum(acc_without)  # the same copy is accepted either way
    assert sum(with_stops) < sum(without)      # but fewer tokens are verified for it


def test_replay_stops_before_a_contested_node() -> None:
    # The prompt's 8-token key K occurs twice; both continuations start 10 11, then one goes on
    # 14 15 ... and the most recent one 30 31 ...: its third node is a guess between the two
    # (kind_lookup_contested). Verifying up to 3 tokens costs about one, 8 tokens 1.4x: the
    # uncontested copy is drafted 7 deep, the contested one only up to the guess. (Without the
    # phrase pool, whose branches would add nodes of their own.)
    key = list(range(1, 9))
    first = [*key, 10, 11, *range(14, 30), 99]
    second = [*key, 10, 11, *range(30, 46), 98]
    output = [10, 11, *range(30, 46)]
    curve = pyspec.CostCurve((1, 3, 8, 64), (50.0, 52.0, 70.0, 1000.0))
    contested, _ = _replay(first + second + key, output, curve, adapt_costs=False, pool=False)
    uncontested, _ = _replay([97] * len(first) + second + key, output, curve, adapt_costs=False, pool=False)
    assert uncontested[0] == 8
    assert contested[0] == 3
    assert _core.kind_lookup_contested() not in {_core.kind_lookup(n) for n in range(1, 66)}


def test_replay_learns_where_copies_of_units_end() -> None:
    # Each request's prompt holds two units of a source, 100 tokens each, with a blank line (50)
    # between them before a token at the left margin (60): the end of a unit. The answers copy
    # the first unit and then turn away (as an answer that rewrites one function of a long file
    # closes its code block). Without the boundary kinds the long copy's drafts run on into the
    # second unit at the long-copy acceptance, and the failures only teach the statistics that
    # long copies fail somewhere; with them the end of a unit has statistics of its own, which
    # learn that the answers turn away there, and later copies stop exactly at it.
    def stream(boundaries: bool) -> list[tuple[list[int], list[int]]]:
        params = pyspec.GenerationConfig(method="auto").to_core()
        params.pool.enabled = False
        params.scheduler.adapt_costs = False
        if boundaries:
            params.lookup.blank_line_tokens, params.lookup.unit_start_tokens = [50], [60]
        requests = []
        for r in range(8):
            first = list(range(1000 + 300 * r, 1100 + 300 * r))
            second = list(range(1100 + 300 * r, 1200 + 300 * r))
            requests.append(([5, *first, 50, 60, *second, 6, 7], first + list(range(300, 310))))
        out = _core.replay_auto(requests, CPU_CURVE._core(), params.lookup, params.pool, params.scheduler)
        return [(list(sizes), list(accepted)) for sizes, accepted, _ in out]

    def wasted(sizes: list[int], accepted: list[int]) -> int:  # drafted and rejected
        return sum(s - 1 - a for s, a in zip(sizes, accepted))

    with_ends, without = stream(True), stream(False)
    for (sizes, accepted), (sizes_without, accepted_without) in zip(with_ends[4:], without[4:]):
        assert wasted(sizes, accepted) == 0 and wasted(sizes_without, accepted_without) >= 5
        assert sum(accepted) >= sum(accepted_without)
        drafted = sum(s > 1 for s in sizes)
        assert drafted < sum(s > 1 for s in sizes_without), (sizes, sizes_without)


def test_replay_learns_a_renamed_identifier() -> None:
    # The prompt quotes a 120-token function that uses an identifier (777) ten times, each after
    # the same token (42, say "("); the answer copies it with the identifier renamed (888 889: a
    # longer name, two tokens) everywhere, as an answer to "rename this variable" does. Without
    # substitutions every later use breaks a long copy's draft at the old name; with them the
    # first break teaches the rename, and later copies propose the new name and go on through it.
    quote, renamed = [], []
    for i in range(10):
        run = [*range(1000 + 20 * i, 1010 + 20 * i), 42]
        quote += [*run, 777]
        renamed += [*run, 888, 889]
    prompt = [5, *quote, 6, 7]

    def replay(substitutions: bool) -> tuple[list[int], list[int]]:
        params = pyspec.GenerationConfig(method="auto", lookup_substitutions=substitutions).to_core()
        params.pool.enabled = False
        ((sizes, accepted, kinds),) = _core.replay_auto([(prompt, renamed)], CPU_CURVE._core(), params.lookup,
                                                        params.pool, params.scheduler)
        assert sum(a + 1 for a in accepted) == len(renamed)
        return list(sizes), list(accepted)

    sizes, accepted = replay(True)
    sizes_without, accepted_without = replay(False)
    # Without them the copy restarts from a short match after every use and goes by in steps of
    # a few tokens; with them the later uses go by inside long drafts.
    assert len(sizes) < 0.6 * len(sizes_without), (sizes, sizes_without)
    assert max(accepted) > 30 and max(accepted_without) < 10, (accepted, accepted_without)
    # Modelled time on the CPU curve: the substitutions make the answer faster.
    cost = lambda ss: sum(CPU_CURVE.at(s) for s in ss)  # noqa: E731
    assert cost(sizes) < 0.8 * cost(sizes_without), (cost(sizes), cost(sizes_without))
    # The switch reaches the lookup parameters; on by default.
    assert pyspec.GenerationConfig(lookup_substitutions=False).to_core().lookup.substitutions is False
    assert pyspec.GenerationConfig().to_core().lookup.substitutions is True


def test_replay_resumes_a_copy_after_an_inserted_stretch() -> None:
    # Each prompt quotes a function (a 40-token run, then 42 43, say "(self", then another
    # 40-token run) and, later, other text where 42 43 go on differently; the answer copies the
    # function but writes two tokens of its own before the 42 (`f(` written `f_sorted(`): the
    # copy breaks once, and no substitution can propose the insertion before it has been seen.
    # Once the output has written the 42, the most recent 42 in the prompt is elsewhere, a
    # one-token match whose copy is contested from its second node; with resync the copy goes on
    # from the source's 42, where it broke, and once that copy is accepted the next step goes on
    # as the long copy it resumed instead of as a new short match.
    requests = []
    for r in range(10):
        base = 1000 + 400 * r
        first, second = list(range(base, base + 40)), list(range(base + 40, base + 80))
        elsewhere = [t for i in range(8) for t in (base + 100 + i, 42, 43, base + 120 + i, base + 140 + i)]
        requests.append(([5, *first, 42, 43, *second, 6, *elsewhere, 7], [*first, 300, 301, 42, 43, *second]))

    def replay(resync: bool) -> list[tuple[list[int], list[int], list[str]]]:
        params = pyspec.GenerationConfig(method="auto", lookup_resync=resync).to_core()
        params.pool.enabled = False
        params.scheduler.adapt_costs = False
        out = _core.replay_auto(requests, CPU_CURVE._core(), params.lookup, params.pool, params.scheduler)
        for (_, answer), (_, accepted, _) in zip(requests, out):
            assert sum(a + 1 for a in accepted) == len(answer)
        return [(list(sizes), list(accepted), [_core.kind_name(k) for k in kinds]) for sizes, accepted, kinds in out]

    def match_len(kind: str) -> int:  # "lookup m9" -> 9
        return int(kind.split(" m")[1]) if kind.startswith("lookup m") else 0

    assert _core.kind_name(_core.kind_lookup_resync()) == "lookup-resync"
    for sizes, accepted, kinds in replay(True)[3:]:  # once the statistics have seen two
        k = kinds.index("lookup-resync")
        # Drafted right after the output's 42, every node accepted; the step after it goes on
        # as a copy of 8 tokens and more (carried over): the two steps take 40 of the 42 tokens left.
        assert sum(a + 1 for a in accepted[:k]) == 43 and accepted[k] == sizes[k] - 1 >= 1, (sizes, accepted, kinds)
        assert match_len(kinds[k + 1]) >= 9 and accepted[k] + accepted[k + 1] + 2 >= 40, (sizes, accepted, kinds)
    for sizes, accepted, kinds in replay(False)[2:]:
        assert "lookup-resync" not in kinds
        # The same place without it: a one-token match elsewhere, then a new short match.
        k = next(i for i, n in enumerate(np.cumsum([a + 1 for a in accepted])) if n > 43)
        assert match_len(kinds[k]) <= 3 and match_len(kinds[k + 1]) <= 3, (sizes, accepted, kinds)
    # The switch reaches the lookup parameters; on by default.
    assert pyspec.GenerationConfig(lookup_resync=False).to_core().lookup.resync is False
    assert pyspec.GenerationConfig().to_core().lookup.resync is True
    assert pyspec.GenerationConfig(lookup_loose_substitutions=False).to_core().lookup.loose_substitutions is False
    assert pyspec.GenerationConfig().to_core().lookup.loose_substitutions is True


def test_replay_an_answer_that_writes_the_given_code_block_out() -> None:
    # Each prompt holds a code block (fence 80, tag 60 at the left margin, newline 50, 40 tokens
    # of code, closing fence 80 and newline 50) after a fence quoted in prose (80 70), and each
    # answer writes the block out again. With the fence tokens, before the answer's first token
    # the block is proposed from its opening fence (kind lookup-answer-start), and once the
    # statistics have seen it hold, the first step drafts the fence and its tag and the second
    # (a fence copy) the rest; without them the first step decodes plainly (the sequence's last
    # token occurs nowhere before) and the copy starts on short keys.
    requests = []
    for r in range(8):
        code = list(range(1000 + 100 * r, 1040 + 100 * r))
        requests.append(([5, 6, 80, 70, 8, 9, 80, 60, 50, *code, 80, 50, 7], [80, 60, 50, *code, 80, 50]))

    def replay(fences: bool) -> list[tuple[list[int], list[int], list[str]]]:
        params = pyspec.GenerationConfig(method="auto").to_core()
        params.pool.enabled = False
        params.scheduler.adapt_costs = False
        params.lookup.unit_start_tokens = [60]
        params.lookup.fence_tokens = [80] if fences else []
        out = _core.replay_auto(requests, CPU_CURVE._core(), params.lookup, params.pool, params.scheduler)
        for (_, answer), (_, accepted, _) in zip(requests, out):
            assert sum(a + 1 for a in accepted) == len(answer)
        return [(list(sizes), list(accepted), [_core.kind_name(k) for k in kinds]) for sizes, accepted, kinds in out]

    with_fences, without = replay(True), replay(False)
    for sizes, accepted, kinds in with_fences[4:]:
        # The fence and its tag drafted before the first token, then the rest of the block as a
        # fence copy: 45 tokens in two steps.
        assert kinds[0] == "lookup-answer-start" and accepted[0] == sizes[0] - 1 >= 2, (sizes, accepted, kinds)
        assert kinds[1] == "lookup-fence" and len(sizes) == 2, (sizes, accepted, kinds)
    for sizes, accepted, kinds in without:
        assert sizes[0] == 1 and len(sizes) >= 4 and "lookup-answer-start" not in kinds, (sizes, accepted, kinds)
    # The switch reaches the lookup parameters; on by default.
    assert pyspec.GenerationConfig(lookup_fences=False).to_core().lookup.fences is False
    assert pyspec.GenerationConfig().to_core().lookup.fences is True


def test_unit_end_tokens_of_a_vocabulary(engine: pyspec.Engine) -> None:
    # What the engine gives the copies (LookupParams), against each token's piece read here.
    blank_line, unit_start, fence = engine._core.layout_tokens()
    assert (list(blank_line), list(unit_start), list(fence)) == layout_tokens_by_piece(engine)
    assert len(unit_start) > 100
    # The tiny vocabulary has no blank-line and no fence token: those two rules are checked on the
    # real vocabulary (tests/test_real_models.py, test_layout_tokens_of_the_real_vocabulary).
    assert list(blank_line) == [] and list(fence) == []
    # The switch that turns them off for a request reaches the lookup parameters.
    assert pyspec.GenerationConfig(lookup_unit_ends=False).to_core().lookup.unit_ends is False
    assert pyspec.GenerationConfig().to_core().lookup.unit_ends is True


def test_calibration_at_a_context(engine: pyspec.Engine) -> None:
    # The decodes are timed over `context` cached tokens; at most what the window leaves beside
    # the largest size (n_ctx 1024, sizes up to 64), and a context below 1 is refused.
    curve = calibration.measure(engine, None, repeats=1, progress=False, context=900)
    assert curve.n_tokens[0] == 1 and all(t > 0 for t in curve.ms)
    assert engine._core.cost(False, "").ms == list(curve.ms)  # installed, as any measurement
    assert calibration.measure(engine, None, repeats=1, progress=False, context=5000).ms[0] > 0
    with pytest.raises(pyspec.InvalidArgumentError, match="calibration context must be >= 1, got 0"):
        calibration.measure(engine, None, repeats=1, progress=False, context=0)


def test_timing_decodes_with_every_or_the_last_logits_row_installs_nothing(engine: pyspec.Engine) -> None:
    # benchmarks/logit_rows_cost.py: the calibration timer with a logits row for every token or
    # only for the last one, leaving the installed curve as it was.
    before = list(engine._core.cost(False, "").ms)
    every = engine._core.time_decodes([1, 2, 8], 1, True, 16)
    last = engine._core.time_decodes([1, 2, 8], 1, False, 16)
    assert list(every.n_tokens) == list(last.n_tokens) == [1, 2, 8]
    assert all(t > 0 for t in list(every.ms) + list(last.ms))
    assert list(engine._core.cost(False, "").ms) == before
    # Calibration's curve is a running maximum (schedule.h's monotone, unit-tested with hand-made
    # curves in tests/cpp/test_schedule.cpp); benchmarks/context_cost.py --every-size asks for
    # the medians as measured, with progress. Whether a raw curve dips depends on the machine's
    # timing noise, so only its shape is checked here.
    sizes = list(range(1, 33))
    calls: list[tuple[int, int]] = []
    for _ in range(3):
        raw = engine._core.time_decodes(sizes, 1, True, 16, non_decreasing=False,
                                        progress=lambda done, total: calls.append((done, total)))
        assert list(raw.n_tokens) == sizes and all(t > 0 for t in raw.ms)
        kept = list(engine._core.time_decodes(sizes, 1, True, 16).ms)
        assert all(b >= a for a, b in zip(kept, kept[1:]))
    assert calls == [(i, len(sizes)) for i in range(1, len(sizes) + 1)] * 3
    assert list(engine._core.cost(False, "").ms) == before
    with pytest.raises(pyspec.InvalidArgumentError, match="calibration context must be >= 1, got 0"):
        engine._core.time_decodes([1], 1, False, 0)


def test_replay_charges_the_actual_curve() -> None:
    # Planned from a flat curve, a certain copy is drafted 64 deep every step. Charged a curve
    # where verifying k tokens costs 3k times one, the cost model corrects the sizes it has seen
    # from the charged steps (by at most 3x per step) and the drafts shrink: the charged times
    # reach the plan.
    quote = list(range(1000, 2200))
    prompt = [900, *quote, 901, 7]
    output = [*quote[:1000]]
    params = pyspec.GenerationConfig(method="auto").to_core()
    params.pool.enabled = False
    dear = pyspec.CostCurve((1, 2, 64), (10.0, 60.0, 1920.0))
    replay = lambda actual: _core.replay_auto([(prompt, output)], flat(10.0)._core(), params.lookup,  # noqa: E731
                                              params.pool, params.scheduler, actual=actual)
    ((as_planned, _, _),) = replay(None)
    ((corrected, _, _),) = replay(dear._core())
    assert set(as_planned[1:-1]) == {65}
    assert len(corrected) > len(as_planned) and min(corrected[1:-1]) < 16
