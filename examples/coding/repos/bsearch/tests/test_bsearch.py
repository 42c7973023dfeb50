from bsearch import index_of


def test_first():
    assert index_of([1, 3, 5, 7], 1) == 0


def test_last():
    assert index_of([1, 3, 5, 7], 7) == 3
