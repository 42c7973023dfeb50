import pytest
from roman import to_roman


def test_additive():
    assert to_roman(8) == "VIII"
    assert to_roman(2023) == "MMXXIII"


def test_nine_and_fourteen():
    assert to_roman(9) == "IX"
    assert to_roman(14) == "XIV"


def test_tens():
    assert to_roman(40) == "XL"
    assert to_roman(90) == "XC"


def test_hundreds():
    assert to_roman(400) == "CD"
    assert to_roman(900) == "CM"


def test_mixed():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"


def test_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
