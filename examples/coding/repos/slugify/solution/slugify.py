"""URL slugs from titles."""


def slugify(title):
    """Lower-case letters and digits, words joined by single dashes."""
    out = []
    for char in title.lower():
        if char.isascii() and char.isalnum():
            out.append(char)
        elif out and out[-1] != "-":
            out.append("-")
    return "".join(out).strip("-")
