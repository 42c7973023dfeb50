from intervals import merge


def test_sorted_overlap():
    assert merge([[1, 3], [2, 4], [6, 8]]) == [[1, 4], [6, 8]]


def test_unsorted():
    assert merge([[5, 6], [1, 3], [2, 4]]) == [[1, 4], [5, 6]]
