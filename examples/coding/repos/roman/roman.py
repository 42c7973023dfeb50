"""Roman numerals."""

NUMERALS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(number):
    """The Roman numeral of an integer from 1 to 3999."""
    if not 1 <= number <= 3999:
        raise ValueError("number must be between 1 and 3999")
    out = ""
    for value, letters in NUMERALS:
        while number >= value:
            out += letters
            number -= value
    return out
