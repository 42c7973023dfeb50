"""Small statistics over text."""


def words(text):
    """The words of ``text``."""
    return text.split()


def word_count(text):
    """How many words ``text`` has."""
    return len(words(text))


def longest_word(text):
    """The longest word of ``text`` (the first one on a tie), or "" for no words."""
    best = ""
    for word in words(text):
        if len(word) > len(best):
            best = word
    return best
