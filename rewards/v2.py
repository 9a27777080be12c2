"""Grader v2: grader v1 (math-verify) after normalisations that reverse verdicts a careful human reverses.

Each rule is listed in docs/grader.md with the v1 verdict it changes and has a test in
tests/test_grader_v2.py. Both the answer and the reference go through `normalise`; the structural
rules (number bases, lists with repeated elements, boxes without content) are checked before
math-verify is asked. Nothing here evaluates the text: regular expressions without nested quantifiers
on a box of at most `max_answer_chars`, inside a worker's CPU limit.
"""

import re

import math_verify
from sympy import Basic
from sympy.matrices import MatrixBase

from rewards.grader import parse_boxed, parse_reference
from rewards.outcome import Outcome

# Digit groups of three after a LaTeX or typographic thousands separator: `2\,220`, `10,\!080`,
# `1{,}000`, `1 000`, `2 220` (thin / narrow no-break space). v1 reads `2\,220` as 222.
_THOUSANDS_SEP = r"(?:\\,|\\;|\\ |~|\u2009|\u202f|\u00a0| |\{,\}|,\\!\s*)"
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:" + _THOUSANDS_SEP + r"\d{3})+(?!\d)")
# A plain comma only where the number cannot be an item of an interval or tuple: `\frac{20,000}{\pi}`
# is read as 20000 by a human and as unparseable by v1, `(12,102)` stays a pair.
_COMMA_THOUSANDS = re.compile(r"(?<![\d.(\[,])(?<![(\[,] )\d{1,3}(?:,\d{3})+(?![\d)\],])(?!\s*[)\]])")
_NOT_DIGIT = re.compile(r"\D")
_DEGREES = re.compile(r"\s*(?:°|\\degree\b|\^\{?\\circ\}?)")
# `5 i`, `\sqrt{2} i`: a space between a coefficient and the imaginary unit (v1: `6 - 5 i` != `6-5i`).
_SPACED_I = re.compile(r"(?<=[\d}])\s+i(?![A-Za-z])")
_TRAILING_PUNCT = re.compile(r"(?:\s|\\[,;!.]|\\ |[.,;:])+$")
# `52_8`, `52_{8}`, `2516_{(8)}`, `A3_{16}`, `52_{\text{8}}`: a numeral and its base.
_BASE = re.compile(r"^\s*([0-9A-Za-z]+)\s*_\s*\{?\s*(?:\\text\{|\\mathrm\{)?\(?(\d+)\)?\}?\s*\}?\s*$")
_PLAIN_NUMERAL = re.compile(r"^\s*([0-9A-Za-z]+)\s*$")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}
_ALNUM = re.compile(r"[0-9A-Za-z]")


def normalise(text: str) -> str:
    for pattern in (_THOUSANDS, _COMMA_THOUSANDS):
        text = pattern.sub(lambda m: _NOT_DIGIT.sub("", m.group()), text)
    text = _DEGREES.sub(r"^\\circ", text)
    text = _SPACED_I.sub("i", text)
    return _TRAILING_PUNCT.sub("", text)


def _numeral(text: str) -> tuple[str, int | None] | None:
    """(digits, base) of `52_8`, (digits, None) of a plain `52`, None for anything else."""
    if m := _BASE.match(text):
        return m[1], int(m[2])
    if m := _PLAIN_NUMERAL.match(text):
        return m[1], None
    return None


def _value(digits: str, base: int) -> int | None:
    try:
        return int(digits, base) if 2 <= base <= 36 else None
    except ValueError:  # a digit the base does not have, e.g. 59_8
        return None


def _compare_bases(answer: str, reference: str) -> Outcome | None:
    """Base-subscripted numerals compare by value in their own bases (v1 drops the subscript)."""
    a, r = _numeral(answer), _numeral(reference)
    if a is None or r is None or (a[1] is None and r[1] is None):
        return None
    if a[1] is None and not a[0].isdigit():
        return None  # a word, not a numeral: leave it to math-verify
    # Without a subscript the answer is read in the reference's base (the question asked for it),
    # and a plain reference is decimal.
    a_value = _value(a[0], a[1] or r[1])
    r_value = _value(r[0], r[1] or 10)
    if r_value is None:
        return None
    return Outcome.CORRECT if a_value == r_value else Outcome.WRONG


def _top_level_items(text: str) -> list[str] | None:
    """The comma-separated items of a bare list (`3, 5, 7`), None if it is not one (a tuple, a set, ...)."""
    items, depth, start, closers = [], 0, 0, []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "{}":  # \{ \} open and close a set
                depth += 1 if nxt == "{" else -1
            i += 2
            continue
        if ch in _BRACKETS:
            depth += 1
            closers.append(_BRACKETS[ch])
        elif ch in ")]}":
            depth -= 1  # intervals mix ( and ]: only the depth matters
            if closers:
                closers.pop()
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
        i += 1
    items.append(text[start:].strip())
    return items if len(items) > 1 and all(items) else None


def _same(answer: str, reference: str) -> bool:
    target, gold = parse_boxed(answer), list(parse_reference(reference))
    return bool(target and gold) and math_verify.verify(
        gold, target, timeout_seconds=None, raise_on_error=True
    )


def _compare_lists(answer: str, reference: str) -> Outcome | None:
    """Bare lists are multisets: v1 reads them as sets, so `3, 5, 5, 7` equals `3, 5, 7`."""
    a, r = _top_level_items(answer), _top_level_items(reference)
    if a is None or r is None:
        return None
    if len(a) != len(r):
        return Outcome.WRONG
    if len(set(a)) == len(a) and len(set(r)) == len(r):
        return None  # no repeats on either side: the set comparison is the multiset one
    unmatched = list(r)
    for item in a:  # one-to-one: each answer item takes one equivalent reference item
        match = next((j for j, ref in enumerate(unmatched) if _same(item, ref)), None)
        if match is None:
            return Outcome.WRONG
        unmatched.pop(match)
    return Outcome.CORRECT


def judge_v2(answer: str, reference: str) -> Outcome:
    """Grader v2: compare an extracted, non-empty answer with the reference. No limits of its own."""
    answer, reference = normalise(answer), normalise(reference)
    if not answer.strip():
        return Outcome.FORMAT_REJECTED
    for rule in (_compare_bases, _compare_lists):
        if (outcome := rule(answer, reference)) is not None:
            return outcome
    target = parse_boxed(answer)
    parsed = any(isinstance(t, (Basic, MatrixBase)) for t in target)
    if not target or (not parsed and not _ALNUM.search(answer)):
        return Outcome.FORMAT_REJECTED  # `=`, `)(`: nothing math-verify could read but the raw string
    gold = list(parse_reference(reference))
    if not gold:
        raise ValueError("the reference answer cannot be parsed")
    equal = math_verify.verify(gold, target, timeout_seconds=None, raise_on_error=True)
    return Outcome.CORRECT if equal else Outcome.WRONG
