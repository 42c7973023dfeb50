import pytest
from leapyear import days_in_month, is_leap


def test_divisible_by_400():
    assert is_leap(2000)
    assert is_leap(1600)


def test_other_centuries():
    assert not is_leap(2100)
    assert not is_leap(1800)


def test_february_1900():
    assert days_in_month(2, 1900) == 28


def test_february_2000():
    assert days_in_month(2, 2000) == 29


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(13, 2020)
