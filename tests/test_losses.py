"""The loss terms more than one method uses (fedpers/core/losses.py) on small known tensors; pFedKDH's own
Eq. (2) is tested in tests/test_pfedkdh.py."""


import pytest
import torch

from fedpers.core.losses import proximal_term


def test_proximal_term_value():
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    r = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    # mu/2 * (1 + 4 + 4) = 0.1/2 * 9
    assert proximal_term(p, r, 0.1).item() == pytest.approx(0.45)
    assert proximal_term(p, r, 0.0).item() == 0.0
