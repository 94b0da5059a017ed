import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.registry import Registry, UnknownNameError
from sparring.segments import compact_ids, segment_first, segment_mean, segment_median, segment_std


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10)), min_size=1, max_size=40))
def test_segment_stats_match_python_reference(pairs):
    ids = torch.tensor([p[0] for p in pairs])
    x = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    n = 5
    mean, std, med = segment_mean(x, ids, n), segment_std(x, ids, n), segment_median(x, ids, n)
    for g in range(n):
        vals = sorted(p[1] for p in pairs if p[0] == g)
        if not vals:
            continue
        m = sum(vals) / len(vals)
        var = sum((v - m) ** 2 for v in vals) / max(len(vals) - 1, 1)
        k = len(vals)
        ref_med = (vals[(k - 1) // 2] + vals[k // 2]) / 2
        assert abs(mean[g] - m) < 1e-9
        assert abs(std[g] - var ** 0.5) < 1e-9
        assert abs(med[g] - ref_med) < 1e-9


def test_compact_ids_and_first():
    ids, n = compact_ids(torch.tensor([3, 3, 1, 3]), torch.tensor([0, 1, 0, 0]))
    assert n == 3
    assert ids[0] == ids[3] and len({int(ids[0]), int(ids[1]), int(ids[2])}) == 3
    assert segment_first(torch.tensor([1, 0, 1, 2]), 3).tolist() == [1, 0, 3]


def test_compact_ids_orders_keys_near_the_int64_limit_and_takes_no_rows():
    big = 2 ** 61
    tuples = [(big, -big), (-big, big), (big, -big), (0, 0), (-big, -big), (0, big)]
    keys = [torch.tensor([t[j] for t in tuples]) for j in range(2)]
    rank = {t: i for i, t in enumerate(sorted(set(tuples)))}
    ids, n = compact_ids(*keys)
    assert n == 5 and ids.tolist() == [rank[t] for t in tuples]
    empty, none = compact_ids(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert none == 0 and empty.shape == (0,)


def test_registry_errors_name_the_problem():
    r = Registry("thing")
    r.register("a", family="f")(lambda: 1)
    try:
        r.register("a", family="f")(lambda: 2)
    except ValueError as e:
        assert "already registered" in str(e)
    else:
        raise AssertionError("duplicate accepted")
    try:
        r.get("b")
    except UnknownNameError as e:
        assert "unknown thing 'b'" in str(e) and "known: a" in str(e)
    else:
        raise AssertionError("unknown name accepted")
