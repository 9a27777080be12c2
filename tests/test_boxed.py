"""Final-answer extraction: the last complete, brace-balanced \\boxed{...}."""

import pytest

from rewards.boxed import last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is $\\boxed{42}$.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{a^{2}+b^{2}}}{2}} done", "\\frac{\\sqrt{a^{2}+b^{2}}}{2}"),
        ("\\boxed {7}", "7"),
        ("\\boxed\n{7}", "7"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are literal, not grouping
        ("\\boxed{\\}}", "\\}"),
        ("first \\boxed{1}, then \\boxed{2}, finally \\boxed{3}.", "3"),
        ("\\boxed{1} and then \\boxed{2", "1"),  # an unclosed trailing box does not hide a complete one
        ("\\boxed{\\boxed{5}}", "\\boxed{5}"),  # the box that closes last is the outer one
        ("\\boxed{x \\boxed{5}", "5"),  # the outer box never closes; the inner one is complete
        ("} stray } braces \\boxed{8} }", "8"),
        ("\\boxed{}", ""),  # a box, but with no answer in it
    ],
)
def test_last_complete_box(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no box at all",
        "\\boxed{1",  # never closed
        "\\boxed{\\frac{1}{2}",
        "\\boxed 7",  # TeX allows it, grader v1 asks for braces
        "\\boxedx{7}",
        "\\fbox{7}",
        "\\\\boxed{7}",  # a line break followed by the word "boxed"
        "",
    ],
)
def test_no_complete_box(text):
    assert last_boxed(text) is None


def test_deep_nesting_needs_no_recursion():
    depth = 200_000
    assert last_boxed("\\boxed{" + "{" * depth + "x" + "}" * depth + "}") == "{" * depth + "x" + "}" * depth
    assert last_boxed("\\boxed{" * depth + "9" + "}" * depth) == "\\boxed{" * (depth - 1) + "9" + "}" * (
        depth - 1
    )
    assert last_boxed("{" * depth + "\\boxed{1}") == "1"


def test_megabytes_of_text():
    filler = "lorem ipsum \\frac{1}{2} { " * 200_000  # about 5 MB, with a million unbalanced braces
    assert last_boxed(filler + "\\boxed{17}" + filler) == "17"
    assert last_boxed(("\\boxed" + " " * 1000) * 2000) is None  # many box starts that never open a brace
