"""Aggregation: hand values, and gradient invariance to the micro-batch split."""

import pytest
import torch

from sparring.aggregation import AGGREGATIONS, aggregate, count_seqs, count_tokens
from sparring.objectives import loss
from sparring.policy.forward import logprobs_from_logits

MODES = AGGREGATIONS.names()


def test_hand_values():
    lo = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # row 2: no tokens
    assert float(aggregate(lo, m, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(lo, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(lo, m, "seq-mean-token-sum")) == pytest.approx(10 / 2)
    assert float(aggregate(lo, m, "seq-mean-token-sum-norm")) == pytest.approx(10 / (2 * 3))
    assert float(aggregate(lo, m, "seq-mean-token-sum-norm", norm=5)) == pytest.approx(1.0)
    assert float(aggregate(lo, m, "token-mean", num_tokens=8)) == pytest.approx(10 / 8)


class TinyPolicy(torch.nn.Module):
    """Embedding -> linear next-token model: a real parameterised log-prob."""

    def __init__(self, vocab: int = 7, dim: int = 4):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=torch.float64))
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=g, dtype=torch.float64))

    def forward(self, ids):
        return logprobs_from_logits(self.emb[ids] @ self.out, ids)[0]


def _data(n=8, T=6, vocab=7):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (n, T), generator=g)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2, 5, 1])  # row 3 has no action token
    mask = (torch.arange(T)[None] >= 1) & (torch.arange(T)[None] <= lengths[:, None])
    adv = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, T).contiguous()
    noise = 0.3 * torch.randn(n, T, generator=g, dtype=torch.float64)
    return ids, mask, adv, noise


def _grads(model, ids, mask, adv, noise, mode, objective, splits, global_counts):
    model.zero_grad()
    counts = dict(num_tokens=count_tokens(mask), num_seqs=count_seqs(mask), norm=6.0)
    for rows in torch.arange(ids.shape[0]).chunk(splits):
        logp = model(ids[rows])
        old = (logp.detach() + noise[rows]) * mask[rows]
        per_tok = loss(objective, logp, old, adv[rows], mask[rows])
        kw = counts if global_counts else dict(norm=6.0)
        aggregate(per_tok, mask[rows], mode, **kw).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("objective", ["ppo_clip", "gspo"])
def test_gradient_invariant_to_micro_batches(mode, objective):
    model = TinyPolicy()
    ids, mask, adv, noise = _data()
    full = _grads(model, ids, mask, adv, noise, mode, objective, 1, global_counts=True)
    assert full.abs().sum() > 0
    for k in (2, 4):
        acc = _grads(model, ids, mask, adv, noise, mode, objective, k, global_counts=True)
        assert torch.allclose(acc, full, rtol=1e-9, atol=1e-12), (mode, k)
    # control: per-micro-batch counts change the gradient, so the test can fail
    local = _grads(model, ids, mask, adv, noise, mode, objective, 2, global_counts=False)
    assert not torch.allclose(local, full, rtol=1e-6, atol=1e-9)
