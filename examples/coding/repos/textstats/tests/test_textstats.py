from textstats import longest_word, word_count


def test_simple_sentence():
    assert word_count("hello world") == 2


def test_double_space():
    assert word_count("hello  world") == 2


def test_longest_word():
    assert longest_word("a quick fox") == "quick"
