"""Penalties and biases on the target's logits (presence, frequency, repetition, logit_bias):
plain decoding against a step-by-step reference written here in numpy, every method's greedy
output against penalised plain decoding, and the sampled distribution of the first two tokens
against the penalised target rows computed in Python (so the second token's row is penalised
for the first)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspec import GenerationConfig, InvalidArgumentError, _core
from test_greedy import PROMPTS
from test_sampling import ALPHA, chi_square_pvalue, first_two_joint

PENALTIES = {
    "presence+frequency": dict(presence_penalty=1.5, frequency_penalty=0.75),
    "repetition": dict(repetition_penalty=1.6),
    "all": dict(presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3),
}
# The flat cost curves of tests/test_end_of_text.py make auto draft at every step it can.
METHODS = [dict(method="chain", n_draft=4), dict(method="tree"), dict(method="beam"), dict(method="lookup"),
           dict(method="ouroboros", n_draft=4), dict(method="auto", auto_adapt_costs=False)]


def penalise(logits: np.ndarray, prompt: list[int], output: list[int], presence_penalty: float = 0.0,
             frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
             logit_bias: dict[int, float] | None = None) -> np.ndarray:
    """The penalised row, as the docs define it (an implementation apart from the engine's)."""
    out = np.array(logits, dtype=np.float32)
    if repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            out[t] = out[t] / repetition_penalty if out[t] > 0 else out[t] * repetition_penalty
    for t in set(output):
        out[t] -= presence_penalty + frequency_penalty * output.count(t)
    for t, b in (logit_bias or {}).items():
        out[t] += b
    return out


@pytest.fixture(scope="module")
def engine(tiny_target: str, tiny_drafts: dict[str, str]):
    import pyspec

    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2) as made:
        made._core.set_cost(False, _core.CostCurve([1, 64], [10.0, 10.0]), "")
        made._core.set_cost(True, _core.CostCurve([1, 64], [0.1, 0.1]), "")
        yield made


@pytest.mark.parametrize("name", PENALTIES)
def test_plain_decoding_follows_the_reference(engine, name: str) -> None:
    """`none` with penalties against an argmax of the penalised row recomputed at every step from
    a fresh evaluation; and the penalty changes the output."""
    options = PENALTIES[name]
    changed = 0
    for text in PROMPTS[:4]:
        prompt = engine.tokenize(text)
        got = engine.generate(prompt, max_tokens=24, method="none", **options).tokens
        output: list[int] = []
        for _ in range(24):
            row = penalise(engine.evaluate(prompt + output)[0], prompt, output, **options)
            output.append(int(np.argmax(row)))
        assert got == output, (name, text)
        changed += got != engine.generate(prompt, max_tokens=24, method="none").tokens
    assert changed > 0


def test_logit_bias_bans_and_forces(engine) -> None:
    prompt = engine.tokenize(PROMPTS[0])
    plain = engine.generate(prompt, max_tokens=12, method="none").tokens
    banned = engine.generate(prompt, max_tokens=12, method="none", logit_bias={plain[0]: -100.0}).tokens
    assert plain[0] not in banned
    forced = engine.generate(prompt, max_tokens=12, method="chain", logit_bias={plain[3]: 100.0}).tokens
    assert forced == [plain[3]] * 12


@pytest.mark.parametrize("options", METHODS, ids=lambda o: o["method"])
@pytest.mark.parametrize("name", PENALTIES)
def test_greedy_output_equals_penalised_plain_decoding(engine, options: dict, name: str) -> None:
    penalties = PENALTIES[name]
    drafted = rejected = 0
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=40, method="none", **penalties)
        spec = engine.generate(prompt, max_tokens=40, **penalties, **options)
        assert spec.tokens == plain.tokens, (name, options, prompt)
        drafted += spec.stats.n_drafted
        rejected += spec.stats.n_drafted - spec.stats.n_accepted
    assert drafted > 0 and rejected > 0, (drafted, rejected)


def penalised_probs(engine, tokens: list[int], prompt: list[int], penalties: dict, **sampling) -> np.ndarray:
    params = _core.SamplingParams()
    for k, v in sampling.items():
        setattr(params, k, v)
    row = penalise(engine.evaluate(tokens)[0], prompt, tokens[len(prompt):], **penalties)
    return np.asarray(_core.compute_probs(np.ascontiguousarray(row), params), dtype=np.float64)


def repeating_prompt(engine, **sampling) -> list[int]:
    """A prompt ending in three copies of the token the target most likes to repeat: the first
    sampled token is then often that token again, drafts propose it, and the second token's row
    changes much with the penalty for the first (where a verifier that forgets the drafted path
    samples other pairs)."""
    base = engine.tokenize("the cat sat on the mat and the cat sat on the")
    params = _core.SamplingParams()
    for k, v in sampling.items():
        setattr(params, k, v)
    repeats = [float(np.asarray(_core.compute_probs(np.ascontiguousarray(engine.evaluate(base + [t] * 3)[0]), params))[t])
               for t in range(engine.n_vocab)]
    return base + [int(np.argmax(repeats))] * 3


@pytest.mark.parametrize("options", [dict(method="chain", n_draft=3), dict(method="tree"), dict(method="lookup")],
                         ids=lambda o: o["method"])
def test_sampled_output_follows_the_penalised_distribution(engine, options: dict) -> None:
    """Chi-square of the first two sampled tokens (T = 1, top_k 6) against the target rows
    penalised in Python, the second row for the first token: a verifier that penalised a
    drafted row for the output before the step only, or not at all, samples other pairs."""
    # Moderate penalties on the output only (a repetition penalty would hit the prompt's copies
    # too, pushing the repeated token out of the top 6 before the first step)
    penalties = dict(presence_penalty=1.0, frequency_penalty=0.5)
    sampling = dict(temperature=1.0, top_k=6)
    prompt = repeating_prompt(engine, **sampling)
    joint = first_two_joint(lambda tokens: penalised_probs(engine, tokens, prompt, penalties, **sampling), prompt)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    drafted = 0
    for seed in range(1500):
        r = engine.generate(prompt, max_tokens=3, seed=seed, **penalties, **sampling, **options)
        counts[index.get((r.tokens[0], r.tokens[1]), len(cells))] += 1
        drafted += len(r.trace.drafted(0))
    assert counts[-1] == 0, "sampled a pair the penalised target gives probability 0"
    assert drafted > 0
    expected = np.array([joint[c] for c in cells])
    assert chi_square_pvalue(counts[:-1], expected / expected.sum()) > ALPHA


def test_out_of_range_settings_are_named(engine) -> None:
    for options, what in ((dict(presence_penalty=2.5), "presence_penalty"),
                          (dict(frequency_penalty=-3.0), "frequency_penalty"),
                          (dict(repetition_penalty=0.0), "repetition_penalty"),
                          (dict(logit_bias={3: 101.0}), "logit_bias of token 3")):
        with pytest.raises(InvalidArgumentError, match=what):
            engine.generate("x", max_tokens=2, **options)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        engine.generate("x", max_tokens=2, logit_bias={engine.n_vocab: 1.0})
    with pytest.raises(TypeError, match="logit_bias keys must be token ids"):
        GenerationConfig(logit_bias={"a": 1.0})
    assert engine.generate("x", max_tokens=4, method="chain").stats.n_generated == 4
