from intervals import merge


def test_empty():
    assert merge([]) == []


def test_touching():
    assert merge([[1, 2], [2, 3]]) == [[1, 3]]


def test_nested():
    assert merge([[1, 10], [2, 3], [4, 5]]) == [[1, 10]]


def test_reversed_input():
    assert merge([[7, 9], [4, 5], [1, 2]]) == [[1, 2], [4, 5], [7, 9]]


def test_unsorted_chain():
    assert merge([[8, 10], [1, 4], [3, 8]]) == [[1, 10]]


def test_input_not_modified():
    data = [[3, 4], [1, 2]]
    merge(data)
    assert data == [[3, 4], [1, 2]]
