"""CaseOps (the field's `lossless_caps_caseops_v1`): a lossless case transform, written here from its description.

The transformed text is in lower case. The case of each ASCII word (a maximal run of [A-Za-z]) moves into four
operator characters from Unicode's private use area, which the tokenizer reserves as pieces of their own:

    U+E001 TITLE    the next letter is upper case: "Hello" -> TITLE hello, "A" -> TITLE a
    U+E002 ALLCAPS  the next word is upper case, two letters or more: "NASA" -> ALLCAPS nasa
    U+E003 CAPNEXT  the next letter, inside a word, is upper case: "iPhone" -> i CAPNEXT phone
    U+E004 ESC      the next character is literal: an operator character that was in the text

Only ASCII letters change ("ÉCOLE" -> "É" ALLCAPS "cole"), so a letter keeps its UTF-8 length. For every string,
decode(encode(text)) == text.
"""

from __future__ import annotations

import re

NAME = "lossless_caps_caseops_v1"  # the field's name for this transform (its manifests' text_transform)
TITLE, ALLCAPS, CAPNEXT, ESC = "\ue001", "\ue002", "\ue003", "\ue004"
OPERATORS = (TITLE, ALLCAPS, CAPNEXT, ESC)  # the order the field reserves them in (user_defined_symbols)

_ESCAPES = {ord(op): ESC + op for op in OPERATORS}
_ANY_OPERATOR = re.compile("[\ue001-\ue004]")
# Encoding is three passes over the text, each a C-speed regex scan (a pass per word in Python is 3x slower):
_ALLCAPS_WORD = re.compile("(?<![A-Za-z])[A-Z]{2,}(?![A-Za-z])")  # a whole word, two letters or more, all capitals
_WORD_START_CAPITAL = re.compile("(?<![A-Za-z])[A-Z]")  # then: "Hello", "McDonald", "A", "Y" in "x2Y"
_INNER_CAPITAL = re.compile("(?<=[A-Za-z])[A-Z]")  # then: the capitals left inside words: "iPhone", "McDonald"
# What an operator applies to: ESC takes any next character, ALLCAPS the whole next word, TITLE and CAPNEXT one letter.
_OPERATION = re.compile("\ue004(.)|\ue002([A-Za-z]+)|[\ue001\ue003]([A-Za-z])", re.S)


def _decode_match(m: re.Match) -> str:
    literal, word, letter = m.groups()
    return literal if literal is not None else (word or letter).upper()


def encode(text: str) -> str:
    """The transformed text: lower-case ASCII words with their case as operators."""
    if _ANY_OPERATOR.search(text):
        text = text.translate(_ESCAPES)
    text = _ALLCAPS_WORD.sub(lambda m: ALLCAPS + m.group().lower(), text)
    text = _WORD_START_CAPITAL.sub(lambda m: TITLE + m.group().lower(), text)
    return _INNER_CAPITAL.sub(lambda m: CAPNEXT + m.group().lower(), text)


def decode(text: str) -> str:
    """The original of transformed text. An operator not followed by what it applies to (which encode never
    writes) is kept as it is, so decode never fails, and text without operators comes back unchanged."""
    return _OPERATION.sub(_decode_match, text)
