from roman import to_roman


def test_small_numbers():
    assert to_roman(1) == "I"
    assert to_roman(3) == "III"


def test_four():
    assert to_roman(4) == "IV"
