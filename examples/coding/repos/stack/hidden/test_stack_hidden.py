import pytest
from stack import Stack


def test_peek_leaves_item():
    s = Stack()
    s.push(1)
    s.push(2)
    s.push(3)
    assert s.peek() == 3
    assert len(s) == 3


def test_peek_after_pop():
    s = Stack()
    for x in "xyz":
        s.push(x)
    s.pop()
    assert s.peek() == "y"


def test_peek_empty_raises_index_error():
    with pytest.raises(IndexError):
        Stack().peek()


def test_pop_empty_raises_index_error():
    with pytest.raises(IndexError):
        Stack().pop()


def test_is_empty():
    s = Stack()
    assert s.is_empty()
    s.push(0)
    assert not s.is_empty()
