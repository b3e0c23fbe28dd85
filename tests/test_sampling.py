"""Sampling exactness: verification reproduces the target distribution (chi-square tests).

Two layers: the pure verify function on hand-made p/q rows, and the whole decoder at
temperature 1 against target probabilities computed from plain evaluation. Seeds are fixed, so
each test is deterministic; the significance level (1e-3) bounds how often a correct
implementation would fail for an unlucky seed choice.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sps

from pyspec import _core

ALPHA = 1e-3


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value of observed counts against expected probabilities.

    Cells with expected count < 5 are pooled into one cell so the approximation holds. Any
    sample on a zero-probability outcome gives p = 0.
    """
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    if np.any(obs[~keep] > 0):
        return 0.0
    return float(sps.chisquare(obs[keep], exp[keep]).pvalue)


def run_verify(p: np.ndarray, q: np.ndarray, n_trials: int, seed: int) -> np.ndarray:
    """Outputs of verify_chain_rejection with drafts sampled from q; returns [n_trials, n_draft+1]."""
    n_draft = q.shape[0]
    rng = _core.Rng(seed)
    draw = np.random.default_rng(seed)
    outs = np.full((n_trials, n_draft + 1), -1, dtype=np.int64)
    for t in range(n_trials):
        draft = [int(draw.choice(q.shape[1], p=q[i])) for i in range(n_draft)]
        v = _core.verify_chain_rejection(draft, p.astype(np.float32), q.astype(np.float32), rng)
        produced = draft[: v.n_accepted] + [v.next_token]
        outs[t, : len(produced)] = produced
    return outs


CASES = {
    "overlapping": (np.array([0.5, 0.2, 0.2, 0.1, 0.0]), np.array([0.1, 0.4, 0.1, 0.2, 0.2])),
    "q_on_p_zeros": (np.array([0.0, 0.0, 0.6, 0.4, 0.0]), np.array([0.3, 0.3, 0.1, 0.1, 0.2])),
    "equal": (np.array([0.25, 0.25, 0.3, 0.1, 0.1]), np.array([0.25, 0.25, 0.3, 0.1, 0.1])),
    "one_hot_q": (np.array([0.3, 0.3, 0.2, 0.1, 0.1]), np.array([0.0, 0.0, 1.0, 0.0, 0.0])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_draft_token_distribution(case: str) -> None:
    p, q = CASES[case]
    outs = run_verify(np.stack([p, p]), q[None, :], n_trials=20000, seed=1)
    counts = np.bincount(outs[:, 0], minlength=5)
    assert chi_square_pvalue(counts, p) > ALPHA
    if case == "equal":
        assert np.all(outs[:, 1] >= 0), "identical p and q must accept every draft token"


def test_two_step_joint_distribution() -> None:
    """First two output tokens when the draft proposes two tokens with different p rows."""
    p0 = np.array([0.4, 0.3, 0.2, 0.1])
    p1 = np.array([0.1, 0.1, 0.2, 0.6])
    q0 = np.array([0.25, 0.25, 0.25, 0.25])
    q1 = np.array([0.7, 0.1, 0.1, 0.1])
    # Row 1 of p applies when the first token was accepted; the test draws p1 regardless of the
    # first token, so the joint target distribution is p0 x p1.
    outs = run_verify(np.stack([p0, p1, p1]), np.stack([q0, q1]), n_trials=20000, seed=2)
    first = outs[:, 0]
    assert chi_square_pvalue(np.bincount(first, minlength=4), p0) > ALPHA
    # Second token exists only when the first draft token was accepted; given acceptance of
    # token x the second token must follow p1.
    second = outs[:, 1][outs[:, 1] >= 0]
    assert chi_square_pvalue(np.bincount(second, minlength=4), p1) > ALPHA


def test_wrong_residual_would_be_detected() -> None:
    """The chi-square check has power: sampling the draft's q directly is rejected."""
    p, q = CASES["overlapping"]
    draw = np.random.default_rng(0)
    naive = draw.choice(5, size=20000, p=q)
    assert chi_square_pvalue(np.bincount(naive, minlength=5), p) < ALPHA


def test_seeded_verification_is_deterministic() -> None:
    p, q = CASES["overlapping"]
    a = run_verify(np.stack([p, p]), q[None, :], n_trials=200, seed=7)
    b = run_verify(np.stack([p, p]), q[None, :], n_trials=200, seed=7)
    assert np.array_equal(a, b)


# -- whole decoder -------------------------------------------------------------------------------


def target_probs(engine, tokens: list[int], **sampling) -> np.ndarray:
    params = _core.SamplingParams()
    for k, v in sampling.items():
        setattr(params, k, v)
    logits = engine.evaluate(tokens)[0]
    return np.asarray(_core.compute_probs(np.ascontiguousarray(logits, dtype=np.float32), params), dtype=np.float64)


def lookup_prompt(engine) -> list[int]:
    """A prompt that ends inside a loop of the target's own greedy output: prompt lookup then
    proposes, from the first step on, tokens the target gives high probability (about 0.7 and 0.2
    for the first two), so both acceptance and rejection of deterministic drafts occur."""
    base = engine.tokenize("def hello():\n    return")
    return base + engine.generate(base, max_tokens=48, method="none").tokens


@pytest.mark.parametrize(
    "kind,method",
    [("perturbed", "chain"), ("independent", "chain"), ("perturbed", "none"), ("perturbed", "lookup"),
     ("perturbed", "tree"), ("perturbed", "beam"), ("independent", "tree"), ("perturbed", "ouroboros"),
     ("perturbed", "lookup+pool")],
)
def test_decoder_samples_target_distribution(engines, kind: str, method: str) -> None:
    """Joint distribution of the first two generated tokens at temperature 1, top_k 6."""
    engine = engines[kind]
    # "lookup": plain prompt lookup (a chain); "lookup+pool": with the phrase pool's branches.
    options = {"pool": method == "lookup+pool"} if method.startswith("lookup") else {}
    method = method.split("+")[0]
    if options.get("pool"):
        engine.generate(lookup_prompt(engine), max_tokens=40, method="lookup")  # phrases to propose
    prompt = lookup_prompt(engine) if method == "lookup" else engine.tokenize("def hello():\n    return")
    n_runs, n_first_drafted, n_accepted, _ = check_first_two_tokens(engine, prompt, method=method, n_draft=3,
                                                                    **options)
    if method == "lookup" and not options["pool"]:
        # Every run drafted both tested tokens at step one, and some drafts were accepted.
        assert n_first_drafted == 2 * n_runs
    if method == "lookup":
        assert n_accepted > 0


@pytest.mark.parametrize("draft_model", [True, False])
def test_auto_samples_target_distribution(tiny_target: str, tiny_drafts: dict[str, str], draft_model: bool) -> None:
    """method auto on a flat cost curve: with the draft model it drafts sampled chains (q rows),
    without it lookup proposals (one-hot); both must leave the target's distribution intact.
    Seeded sampled requests never use the draft model, so the model case runs unseeded (the
    engine's own seeded stream)."""
    import pyspec

    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2) as engine:
        engine._core.set_cost(False, _core.CostCurve([1, 64], [10.0, 10.0]), "")
        engine._core.set_cost(True, _core.CostCurve([1, 64], [0.1, 0.1]), "")
        prompt = engine.tokenize("def hello():\n    return") if draft_model else lookup_prompt(engine)
        n_runs, n_first_drafted, n_accepted, n_draft_decodes = check_first_two_tokens(
            engine, prompt, seeded=not draft_model, method="auto", auto_draft_model=draft_model,
            auto_adapt_costs=False)
        assert n_first_drafted > n_runs // 2 and n_accepted > 0  # drafts were proposed and accepted
        assert (n_draft_decodes > 0) == draft_model


def first_two_joint(row_probs, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(first two tokens = (a, b)) from row_probs(tokens), the next-token distribution after tokens."""
    p1 = row_probs(prompt)
    joint = {}
    for a in np.flatnonzero(p1):
        p2 = row_probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            joint[(int(a), int(b))] = p1[a] * p2[b]
    return joint


def check_first_two_tokens(engine, prompt: list[int], seeded: bool = True, **options) -> tuple[int, int, int, int]:
    """Chi-square test of the joint distribution of the first two sampled tokens (T = 1, top_k
    6) against the target's; run r uses seed r when seeded. Returns (runs, tokens drafted at step
    one, tokens accepted, draft-model decodes)."""
    sampling = dict(temperature=1.0, top_k=6)
    joint = first_two_joint(lambda tokens: target_probs(engine, tokens, **sampling), prompt)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    n_runs = 1500
    n_first_drafted = n_accepted = n_draft_decodes = 0
    for seed in range(n_runs):
        r = engine.generate(prompt, max_tokens=3, seed=seed if seeded else None, **sampling, **options)
        n_draft_decodes += r.stats.n_draft_decodes
        counts[index.get((r.tokens[0], r.tokens[1]), len(cells))] += 1
        n_first_drafted += len(r.trace.drafted(0))
        n_accepted += r.stats.n_accepted
    assert counts[-1] == 0, "generated a pair the target gives probability 0"
    expected = np.array([joint[c] for c in cells])
    assert chi_square_pvalue(counts[:-1], expected / expected.sum()) > ALPHA
    return n_runs, n_first_drafted, n_accepted, n_draft_decodes


def test_seeded_generation_is_deterministic(engines) -> None:
    engine = engines["perturbed"]
    a = engine.generate("The quick", max_tokens=30, temperature=0.9, top_p=0.9, seed=123)
    b = engine.generate("The quick", max_tokens=30, temperature=0.9, top_p=0.9, seed=123)
    c = engine.generate("The quick", max_tokens=30, temperature=0.9, top_p=0.9, seed=124)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
