"""Find the final answer of a completion: the content of its last complete `\\boxed{...}` (SPEC §2).

Completions are untrusted and can be megabytes long, so the scan is a single left-to-right pass over
a tokenising regex without nested quantifiers (linear time, no backtracking blow-up) and an explicit
stack (no recursion, however deep the braces go).
"""

import re

# Alternatives are tried in order at each position: an escaped backslash is consumed as a pair first so
# that `\\boxed{` (line break, then the word "boxed") is not a box; `\{` and `\}` are literal braces in
# LaTeX, not grouping; `\boxed` may be followed by spaces before its brace, as TeX allows.
_TOKENS = re.compile(r"\\\\|\\[{}]|\\boxed\s*\{|[{}]")


def last_boxed(text: str) -> str | None:
    """Content of the last complete, brace-balanced `\\boxed{...}` in `text`, or None if there is none.

    "Last" is the box whose closing brace comes last, so an unclosed trailing box does not hide an
    earlier complete one. An empty box returns "" (a box with no gradeable answer, not a missing box).
    """
    depth = 0
    open_boxes: list[tuple[int, int]] = []  # (depth inside the box, index where its content starts)
    last: tuple[int, int] | None = None
    for token in _TOKENS.finditer(text):
        kind = token.group()
        if kind == "}":
            if depth == 0:
                continue  # a stray closing brace closes nothing
            depth -= 1
            if open_boxes and open_boxes[-1][0] == depth + 1:
                last = (open_boxes.pop()[1], token.start())
        elif kind == "{":
            depth += 1
        elif kind.startswith("\\boxed"):
            depth += 1
            open_boxes.append((depth, token.end()))
        # anything else is an escaped backslash or brace: not grouping, nothing to do
    if last is None:
        return None
    return text[last[0] : last[1]]
