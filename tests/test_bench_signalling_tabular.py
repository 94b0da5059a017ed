"""bench/signalling_tabular.py: the overlapping features have the cosine asked for, and the
learner on them finds the code or pools as the docs say."""

import pytest
import torch

from tests.helpers import load_bench

tabular = load_bench("signalling_tabular")


@pytest.mark.parametrize("overlap, dim", [(0.0, 5), (0.9, 64), (0.5, 9)])
def test_features_are_unit_vectors_with_the_asked_cosine(overlap, dim):
    phi = tabular.overlapping_features(4, overlap, dim, torch.Generator().manual_seed(0))
    assert phi.shape == (4, dim)
    gram = phi @ phi.T
    want = torch.full((4, 4), overlap) + torch.eye(4) * (1 - overlap)
    torch.testing.assert_close(gram, want, atol=1e-5, rtol=0)


def test_bad_overlap_or_dim_is_an_error():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="overlap 1.0 must be in"):
        tabular.overlapping_features(4, 1.0, 8, g)
    with pytest.raises(ValueError, match="dim 4 at least k"):
        tabular.overlapping_features(4, 0.5, 4, g)


def test_exact_ascent_codes_on_independent_features_and_pools_on_overlapping_ones():
    """The two ends of docs/benchmarks.md's table, under exact ascent (no sampling): with the
    uniform pull on independent features every seed finds a permutation; with no pull on
    features at cosine 0.95 none does."""
    def run(seed, kind, coef, overlap):
        return tabular.train(seed, mode="exact", kind=kind, coef=coef, k=4, steps=500,
                             batch=64, lr=0.05, epochs=1, init=1.0, overlap=overlap, dim=16)
    assert [run(s, "mutation", 0.05, 0.0) for s in range(3)] == [1.0] * 3
    assert all(run(s, "none", 0.0, 0.95) < 1.0 for s in range(3))
