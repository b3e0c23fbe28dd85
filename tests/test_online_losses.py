"""Distillation losses: each against a hand computation on tiny tensors, the top-k restriction,
temperature, gradients, and one real optimizer step on a tiny GGUF draft distilled from a tiny
target evaluated by llama.cpp."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pyspec
from online_golden import GOLDEN_TEXT
from pyspec._models.tiny import build_tiny_model
from pyspec.online import LOSSES, TopK, cross_entropy, distill_loss, forward_kl, jsd, load_gguf, reverse_kl

LN2 = math.log(2.0)

# One row over a vocabulary of 3: student q = softmax(0, ln 2, ln 5) = (1/8, 2/8, 5/8),
# target p = (1/2, 1/4, 1/4). Asymmetric, so KL(p || q) != KL(q || p).
STUDENT = torch.tensor([[0.0, LN2, math.log(5.0)]])
TARGET = torch.tensor([[0.5, 0.25, 0.25]])
P = [1 / 2, 1 / 4, 1 / 4]
Q = [1 / 8, 2 / 8, 5 / 8]


def kl(a: list[float], b: list[float]) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)


def test_forward_kl_by_hand() -> None:
    # 1/2 ln(4) + 1/4 ln(1) + 1/4 ln(2/5)
    expected = 0.5 * math.log(4) + 0.25 * math.log(2 / 5)
    assert expected == pytest.approx(kl(P, Q))
    assert forward_kl(STUDENT, TARGET).item() == pytest.approx(expected, rel=1e-6)


def test_reverse_kl_by_hand() -> None:
    # 1/8 ln(1/4) + 2/8 ln(1) + 5/8 ln(5/2)
    expected = 0.125 * math.log(0.25) + 0.625 * math.log(2.5)
    assert expected == pytest.approx(kl(Q, P))
    assert reverse_kl(STUDENT, TARGET).item() == pytest.approx(expected, rel=1e-6)


def test_jsd_by_hand() -> None:
    for beta in (0.5, 0.1, 0.9):
        m = [beta * a + (1 - beta) * b for a, b in zip(P, Q)]
        expected = beta * kl(P, m) + (1 - beta) * kl(Q, m)
        assert jsd(STUDENT, TARGET, beta=beta).item() == pytest.approx(expected, rel=1e-5), beta
    # beta = 1/2, m = (5/16, 4/16, 7/16): the symmetric Jensen-Shannon divergence
    expected = 0.5 * (0.5 * math.log(8 / 5) + 0.25 * math.log(4 / 7)) \
        + 0.5 * (0.125 * math.log(2 / 5) + 0.625 * math.log(10 / 7))
    assert jsd(STUDENT, TARGET, beta=0.5).item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="beta"):
        jsd(STUDENT, TARGET, beta=1.0)


def test_cross_entropy_by_hand() -> None:
    # the target's argmax is token 0, q(0) = 1/8
    assert cross_entropy(STUDENT, TARGET).item() == pytest.approx(math.log(8), rel=1e-6)
    assert cross_entropy(STUDENT, TARGET, tokens=torch.tensor([2])).item() == pytest.approx(math.log(8 / 5), rel=1e-6)
    top = TopK(ids=torch.tensor([[2, 1]]), probs=torch.tensor([[0.3, 0.2]]))
    assert cross_entropy(STUDENT, top).item() == pytest.approx(math.log(8 / 5), rel=1e-6)  # full softmax, y = 2


def test_temperature_by_hand() -> None:
    # tau = 2: q = softmax(z / 2) ~ (1, sqrt 2, sqrt 5), p ~ p^(1/2) = (sqrt(1/2), 1/2, 1/2)
    tau = 2.0
    q = [1, math.sqrt(2), math.sqrt(5)]
    q = [x / sum(q) for x in q]
    p = [math.sqrt(0.5), 0.5, 0.5]
    p = [x / sum(p) for x in p]
    assert forward_kl(STUDENT, TARGET, tau=tau).item() == pytest.approx(kl(p, q), rel=1e-5)
    assert reverse_kl(STUDENT, TARGET, tau=tau).item() == pytest.approx(kl(q, p), rel=1e-5)
    assert cross_entropy(STUDENT, TARGET, tau=tau).item() == pytest.approx(-math.log(q[0]), rel=1e-6)
    with pytest.raises(ValueError, match="tau"):
        forward_kl(STUDENT, TARGET, tau=0.0)


def test_top_k_restricts_both_distributions_to_the_target_support() -> None:
    # Vocabulary of 4; the target's top 2 are ids 3 and 1 with probabilities 0.6 and 0.2 (the
    # rest of its mass elsewhere): renormalised p = (3/4, 1/4) over (3, 1). The student's logits
    # at (3, 1) are (ln 3, 0) -> restricted q = (3/4, 1/4): every divergence is 0, whatever the
    # student puts on ids 0 and 2.
    student = torch.tensor([[5.0, 0.0, -2.0, math.log(3)]])
    top = TopK(ids=torch.tensor([[3, 1]]), probs=torch.tensor([[0.6, 0.2]]))
    for loss in (forward_kl, reverse_kl, jsd):
        assert loss(student, top).item() == pytest.approx(0.0, abs=1e-6), loss.__name__
    # restricted q = (1/2, 1/2) now: KL(p || q) = 3/4 ln(3/2) + 1/4 ln(1/2)
    student = torch.tensor([[5.0, 0.0, -2.0, 0.0]])
    assert forward_kl(student, top).item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-5)
    # the same as the full-row loss on the two ids
    full_student = student[:, [3, 1]]
    assert forward_kl(full_student, torch.tensor([[0.75, 0.25]])).item() == pytest.approx(forward_kl(student, top).item())


def test_rows_reduce_by_mean_sum_or_none() -> None:
    student = torch.cat([STUDENT, torch.zeros(1, 3)])  # second row: q uniform
    target = torch.cat([TARGET, torch.full((1, 3), 1 / 3)])  # p uniform: KL 0
    first = kl(P, Q)
    per_row = forward_kl(student, target, reduction="none")
    assert per_row.tolist() == pytest.approx([first, 0.0], abs=1e-6)
    assert forward_kl(student, target).item() == pytest.approx(first / 2, rel=1e-6)
    assert forward_kl(student, target, reduction="sum").item() == pytest.approx(first, rel=1e-6)


def test_zero_target_probabilities_give_finite_losses_and_gradients() -> None:
    student = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    target = torch.tensor([[0.0, 1.0, 0.0]])
    for name in LOSSES:
        value = distill_loss(student, target, loss=name)
        (grad,) = torch.autograd.grad(value, student)
        assert torch.isfinite(value) and torch.isfinite(grad).all(), name


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="target probabilities"):
        forward_kl(STUDENT, torch.ones(1, 4) / 4)
    with pytest.raises(ValueError, match="TopK"):
        forward_kl(STUDENT, TopK(ids=torch.tensor([[0, 1]]), probs=torch.tensor([[0.5]])))
    with pytest.raises(ValueError, match="loss must be"):
        distill_loss(STUDENT, TARGET, loss="mse")


# ----------------------------------------------------------------------------------------------
# One optimizer step on a tiny GGUF draft


@pytest.fixture(scope="module")
def distillation_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """(student GGUF, tokens [n], target probabilities [n, V]): the target is an independent tiny
    model evaluated by llama.cpp, the student a perturbed copy of another."""
    folder = tmp_path_factory.mktemp("online_losses")
    target = build_tiny_model(folder / "target.gguf", seed=31)
    student = build_tiny_model(folder / "student.gguf", seed=32, arch="qwen2")
    with pyspec.Engine(str(target), n_ctx=256, n_threads=2) as engine:
        tokens = engine.tokenize(GOLDEN_TEXT)
        logits = engine.evaluate(tokens, all_rows=True)
    probs = torch.softmax(torch.from_numpy(logits), dim=-1)
    return student, torch.tensor(tokens), probs


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("top_k", [None, 8])
def test_one_optimizer_step_lowers_the_loss(distillation_batch, name: str, top_k: int | None) -> None:
    student_path, tokens, probs = distillation_batch
    if top_k is None:
        target = probs
    else:
        top = probs.topk(top_k, dim=-1)
        target = TopK(ids=top.indices, probs=top.values)
    model = load_gguf(student_path).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_now() -> torch.Tensor:
        return distill_loss(model(tokens), target, loss=name, tau=2.0 if name == "jsd" else 1.0)

    before = loss_now()
    optimizer.zero_grad()
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss_now()
    assert after.item() < before.item(), f"{name}: {before.item():.5f} -> {after.item():.5f}"


def test_importing_pyspec_does_not_import_torch(tmp_path) -> None:
    code = ("import sys, pyspec, pyspec.cli, pyspec.models, pyspec.bench, pyspec.data; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    # Not from the checkout's root: `python -c` puts the working directory first on sys.path, and
    # the source tree's pyspec/ has no compiled module.
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
