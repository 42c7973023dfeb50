from slugify import slugify


def test_lower_case():
    assert slugify("Python") == "python"


def test_many_spaces():
    assert slugify("a   b    c") == "a-b-c"


def test_edges():
    assert slugify("  --Top 10 Tips--  ") == "top-10-tips"


def test_already_a_slug():
    assert slugify("already-a-slug") == "already-a-slug"


def test_only_symbols():
    assert slugify("!!!") == ""
