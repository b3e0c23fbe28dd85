"""The decoder's sampled output against the target's exact distribution, with a sample size
shown to reject a verifier that resamples from the target's row after a rejection instead of
from the residual max(0, p - q).

Temperature 0.7 with top_p and min_p; the draft is the perturbed copy of the target: its q
overlaps p by about 3/4, so drafts are often accepted, rejections still happen, and the residual
differs from p. (With the independent draft the supports do not overlap after top_p / min_p, the
residual is p itself and no sample size could tell the two verifiers apart.) The first generated token comes from one verification
of a one-token chain drafted by sampling q; its exact distribution is p, the wrong verifier's is
min(p, q) + (1 - sum min(p, q)) * p, both computed here from the models' logits, and the power of
the chi-square test against the wrong one is computed before sampling.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps
from test_sampling import ALPHA, chi_square_pvalue

from pyspec import _core

SAMPLING = dict(temperature=0.7, top_p=0.9, min_p=0.05)
N_RUNS = 2000


def probs(engine, tokens: list[int], draft: bool) -> np.ndarray:
    params = _core.SamplingParams()
    for k, v in SAMPLING.items():
        setattr(params, k, v)
    logits = engine.evaluate(tokens, draft=draft)[0]
    row = np.asarray(_core.compute_probs(np.ascontiguousarray(logits, dtype=np.float32), params), dtype=np.float64)
    return row / row.sum()


def power(p: np.ndarray, wrong: np.ndarray, n: int) -> float:
    """Power of the chi-square test at ALPHA (cells as the test pools them) when the samples
    follow `wrong`: noncentral chi-square with noncentrality n * sum((wrong - p)^2 / p)."""
    cells = p * n >= 5
    pe = np.append(p[cells], p[~cells].sum())
    we = np.append(wrong[cells], wrong[~cells].sum())
    keep = pe > 0
    df = int(keep.sum()) - 1
    nc = n * float(((we[keep] - pe[keep]) ** 2 / pe[keep]).sum())
    return float(sps.ncx2.sf(sps.chi2.isf(ALPHA, df), df, nc))


def test_first_token_follows_target_not_resampled_p(engines) -> None:
    prompt = "The quick brown fox"
    engine = engines["perturbed"]
    tokens = engine.tokenize(prompt)
    p = probs(engine, tokens, draft=False)
    q = probs(engine, tokens, draft=True)
    overlap = np.minimum(p, q)
    wrong = overlap + (1.0 - overlap.sum()) * p  # rejected drafts resampled from p
    assert power(p, wrong, N_RUNS) > 0.99
    counts = np.zeros(len(p))
    n_drafted = n_rejected = 0
    for seed in range(N_RUNS):
        r = engine.generate(tokens, max_tokens=2, method="chain", n_draft=1, seed=seed, **SAMPLING)
        counts[r.tokens[0]] += 1
        n_drafted += r.stats.n_drafted
        n_rejected += int(r.trace.n_accepted[0] == 0)
    assert n_drafted == N_RUNS and 0 < n_rejected < N_RUNS  # every run drafted; some were rejected
    assert counts[p == 0].sum() == 0
    assert chi_square_pvalue(counts, p) > ALPHA
