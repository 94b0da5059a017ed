"""BoundedMemo: hits do not recompute; a full memo empties itself before storing."""

from sparring.memo import BoundedMemo


def test_bounded_memo():
    calls = []
    m = BoundedMemo(2)

    def make(v):
        return lambda: calls.append(v) or v * 10

    assert m.get_or("a", make(1)) == 10 and m.get_or("a", make(9)) == 10
    assert m.get_or("b", make(2)) == 20 and calls == [1, 2]
    assert m.get_or("c", make(3)) == 30  # full: cleared, then "c" stored
    assert dict(m) == {"c": 30}
    assert m.get_or("a", make(4)) == 40 and calls == [1, 2, 3, 4]
