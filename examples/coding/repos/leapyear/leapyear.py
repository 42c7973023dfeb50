"""Leap years and month lengths in the Gregorian calendar."""

DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    """Whether ``year`` has a 29 February."""
    return year % 4 == 0


def days_in_month(month, year):
    """Days in ``month`` (1-12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError("month must be between 1 and 12")
    if month == 2 and is_leap(year):
        return 29
    return DAYS[month - 1]
