"""`RowSparseAdamW` (sparring.train.row_sparse_adamw): over steps where a matrix's gradient
touches a few rows, and on other steps none or other rows, its weights and moments equal
torch's AdamW bit for bit, the other parameters too; the rows never touched keep their
values; its state loads into AdamW and AdamW's into it."""

import pytest
import torch

from sparring.train.row_sparse_adamw import RowSparseAdamW


def models(seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Parameter(torch.randn(50, 16))
    bias = torch.nn.Parameter(torch.randn(16))
    return head, bias


def grads(step):
    """The gradient of each step: rows 3, 7 and 11 (step 0), none (step 1), rows 7 and 40
    (steps 2-5), and the bias always."""
    g = torch.Generator().manual_seed(100 + step)
    head = torch.zeros(50, 16)
    rows = [[3, 7, 11], [], [7, 40], [7, 40], [7, 40], [7, 40]][step]
    for r in rows:
        head[r] = torch.randn(16, generator=g)
    return head, torch.randn(16, generator=g)


def run(opt_cls, steps=6, lr=(1e-2, 5e-3), start=None, fused=None):
    head, bias = models()
    groups = [{"params": [head], "lr": lr[0]}, {"params": [bias], "lr": lr[1]}]
    kw = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "fused": fused}
    opt = opt_cls(groups, **kw, **({"sparse": [head]} if opt_cls is RowSparseAdamW else {}))
    if start is not None:
        opt.load_state_dict(start[0])
        with torch.no_grad():
            head.copy_(start[1])
            bias.copy_(start[2])
    first = 0 if start is None else 6 - steps  # a loaded state goes on to step 6
    for s in range(first, first + steps):
        head.grad, bias.grad = grads(s)
        opt.step()
    return head.detach(), bias.detach(), opt


@pytest.mark.parametrize("fused", [None, True])
def test_row_sparse_adamw_equals_adamw_bit_for_bit(fused):
    h0, _ = models()
    want_h, want_b, want = run(torch.optim.AdamW, fused=fused)
    got_h, got_b, got = run(RowSparseAdamW, fused=fused)
    assert torch.equal(got_h, want_h) and torch.equal(got_b, want_b)
    head = got.param_groups[0]["params"][0]
    for k in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(got.state[head][k], want.state[want.param_groups[0]["params"][0]][k])
    untouched = [r for r in range(50) if r not in (3, 7, 11, 40)]
    assert torch.equal(got_h[untouched], h0[untouched])
    assert got.state[head]["rows"].nonzero().squeeze(1).tolist() == [3, 7, 11, 40]


@pytest.mark.parametrize("first,then", [(torch.optim.AdamW, RowSparseAdamW),
                                        (RowSparseAdamW, torch.optim.AdamW)])
def test_either_reads_the_others_state_and_goes_on_equal(first, then):
    """Three steps of one, its state and weights loaded into the other for the last three."""
    want_h, want_b, _ = run(torch.optim.AdamW)
    h, b, opt = run(first, steps=3)
    got_h, got_b, _ = run(then, steps=3, start=(opt.state_dict(), h, b))
    assert torch.equal(got_h, want_h) and torch.equal(got_b, want_b)


def test_weight_decay_on_a_sparse_matrix_is_refused():
    head, _ = models()
    with pytest.raises(ValueError, match="no weight decay"):
        RowSparseAdamW([head], sparse=[head], weight_decay=0.01)
