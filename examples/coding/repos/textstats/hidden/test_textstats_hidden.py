from textstats import longest_word, word_count, words


def test_one_word():
    assert word_count("hello") == 1


def test_empty():
    assert word_count("") == 0
    assert longest_word("") == ""


def test_newlines_and_tabs():
    assert word_count("one\ntwo\tthree") == 3


def test_leading_and_trailing_spaces():
    assert word_count("  padded text  ") == 2


def test_words_list():
    assert words("a  b\nc") == ["a", "b", "c"]


def test_longest_word_tie_keeps_first():
    assert longest_word("cat dog  emu") == "cat"
