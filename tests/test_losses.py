"""pFedKDH Eq. (2) and its parts on small known tensors."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedpers.algorithms.pfedkdh import pfedkdh_objective
from fedpers.core.losses import distillation_kl, proximal_term


def test_distillation_kl_known_value():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # softmax -> (0.75, 0.25) at T=1
    # KL((.75,.25) || (.5,.5)) = .75 ln 1.5 + .25 ln .5
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert distillation_kl(student, teacher, 1.0).item() == pytest.approx(expected)


def test_distillation_kl_temperature_softens_and_is_zero_for_equal_logits():
    a = torch.tensor([[2.0, -1.0, 0.5]])
    assert abs(distillation_kl(a, a.clone(), 3.0).item()) < 1e-7
    b = torch.tensor([[-1.0, 2.0, 0.0]])
    assert distillation_kl(a, b, 5.0) < distillation_kl(a, b, 1.0)


def test_teacher_gets_no_gradient():
    s = torch.randn(4, 3, requires_grad=True)
    t = torch.randn(4, 3, requires_grad=True)
    distillation_kl(s, t, 2.0).backward()
    assert t.grad is None and s.grad is not None


def test_proximal_term_value():
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    r = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    # mu/2 * (1 + 4 + 4) = 0.1/2 * 9
    assert proximal_term(p, r, 0.1).item() == pytest.approx(0.45)
    assert proximal_term(p, r, 0.0).item() == 0.0


def test_pfedkdh_objective_combines_terms_exactly():
    torch.manual_seed(0)
    s, t = torch.randn(5, 4), torch.randn(5, 4)
    y = torch.tensor([0, 1, 2, 3, 0])
    theta, theta_g = [torch.ones(3)], [torch.zeros(3)]
    T, lam, mu = 2.0, 0.3, 0.5
    got = pfedkdh_objective(s, t, y, temperature=T, lambda_kd=lam, mu=mu, backbone=theta, global_backbone=theta_g)
    kl = F.kl_div(F.log_softmax(s / T, 1), F.softmax(t / T, 1), reduction="batchmean")
    expected = (1 - lam) * F.cross_entropy(s, y) + lam * T**2 * kl + mu / 2 * 3.0
    assert got.item() == pytest.approx(expected.item())


def test_pfedkdh_objective_reduces_to_cross_entropy():
    s, t = torch.randn(6, 3), torch.randn(6, 3)
    y = torch.randint(0, 3, (6,))
    got = pfedkdh_objective(s, t, y, temperature=4.0, lambda_kd=0.0, mu=0.0, backbone=[torch.ones(2)],
                            global_backbone=[torch.zeros(2)])
    assert got.item() == pytest.approx(F.cross_entropy(s, y).item())
