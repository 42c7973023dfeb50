from bsearch import index_of


def test_middle():
    assert index_of([2, 4, 6, 8, 10], 6) == 2


def test_single():
    assert index_of([5], 5) == 0


def test_missing():
    assert index_of([1, 3, 5], 4) == -1
    assert index_of([], 1) == -1


def test_every_element():
    items = list(range(0, 40, 3))
    assert [index_of(items, x) for x in items] == list(range(len(items)))


def test_two_elements():
    assert index_of([1, 2], 2) == 1
