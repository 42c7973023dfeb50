from leapyear import days_in_month, is_leap


def test_ordinary_years():
    assert is_leap(2024)
    assert not is_leap(2023)


def test_century():
    assert not is_leap(1900)


def test_april():
    assert days_in_month(4, 2023) == 30
