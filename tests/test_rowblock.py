"""rowblock: the bitwise masked select equals torch.where exactly, also off-mask inf/NaN."""

import pytest
import torch

from sparring.advantages.rowblock import float_mask, keep_where, masked_row_sum


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_keep_where_is_where(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 13, generator=g).to(dtype)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")]).to(dtype)
    m = torch.rand(7, 13, generator=g) < 0.5
    m[0, :3] = False
    got = keep_where(m, x)
    assert got.dtype == dtype
    assert torch.equal(got, torch.where(m, x, torch.zeros((), dtype=dtype)))
    assert not got[0, :3].any()  # non-finite values off the mask become exactly 0
    out = torch.full((7, 13), 5.0, dtype=dtype)
    assert keep_where(m, x, out=out) is out and torch.equal(out, got)


def test_keep_where_broadcasts_a_column():
    col = torch.tensor([[1.5], [-2.0]])
    m = torch.tensor([[True, False, True], [False, True, True]])
    assert keep_where(m, col).tolist() == [[1.5, 0.0, 1.5], [0.0, -2.0, -2.0]]


def test_keep_where_keeps_autograd_and_ints_on_torch_where():
    x = torch.ones(2, 2, requires_grad=True)
    keep_where(torch.tensor([[True, False], [False, True]]), x).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert keep_where(torch.tensor([True, False]), torch.tensor([3, 4])).tolist() == [3, 0]


def test_float_mask_and_masked_row_sum():
    m = torch.tensor([[True, False, True], [False, False, False]])
    assert float_mask(m, torch.float64).tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    x = torch.tensor([[1.0, float("nan"), 2.5], [4.0, 5.0, 6.0]])
    assert masked_row_sum(x, m).tolist() == [3.5, 0.0]


def test_keep_where_large_goes_by_row_blocks_and_matches_where():
    from sparring.advantages.rowblock import BLOCK_ELEMS

    g = torch.Generator().manual_seed(1)
    n = 3 * BLOCK_ELEMS // 100 + 7  # several blocks of 100-wide rows, a ragged last one
    m = torch.rand(n, 100, generator=g) < 0.5
    col = torch.randn(n, 1, generator=g)
    full = torch.randn(n, 100, generator=g)
    for x in (col, full):
        want = torch.where(m, x, torch.zeros(()))
        assert torch.equal(keep_where(m, x), want)
        out = torch.empty(n, 100)
        assert keep_where(m, x, out=out) is out and torch.equal(out, want)
