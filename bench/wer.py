"""Word error rate: the words a recogniser got wrong, against what was said.

Both sides are normalised first, so that only a change of words counts: case and punctuation
go, a few contractions are spelled out, and number words become digits (Whisper writes "for 2
at 7" for "for two at seven", which is right).
"""

from __future__ import annotations

import re

_NUMBERS = {word: str(n) for n, word in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
))}
_NUMBERS.update({"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100"})
# Two to ten in German, French and Spanish ("one" is left out: there it is also an article).
for _words in ("zwei drei vier fünf sechs sieben acht neun zehn", "deux trois quatre cinq six sept huit neuf dix",
               "dos tres cuatro cinco seis siete ocho nueve diez"):
    _NUMBERS.update({word: str(n) for n, word in enumerate(_words.split(), start=2)})
_CONTRACTIONS = {"what's": "what is", "it's": "it is", "i'm": "i am", "i'd": "i would", "let's": "let us",
                 "don't": "do not", "can't": "can not", "cannot": "can not", "won't": "will not",
                 "that's": "that is", "there's": "there is", "where's": "where is", "i'll": "i will",
                 "you're": "you are", "isn't": "is not"}


def normalise(text: str) -> list[str]:
    """The words of ``text``, compared as they would be read: lower case, no punctuation,
    contractions spelled out, numbers as digits ("2.7" is the two numbers Whisper heard)."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"(\d)[.:](\d)", r"\1 \2", text)
    out: list[str] = []
    for word in re.findall(r"[^\W_]+(?:'[^\W_]+)*", text):
        for part in _CONTRACTIONS.get(word, word).split():
            out.append(_NUMBERS.get(part, part))
    return [word for word in out if word]


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, words in the reference): the word-level edit
    distance between the two, after normalising both."""
    ref, hyp = normalise(reference), normalise(heard)
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, start=1):
        current = [i]
        for j, other in enumerate(hyp, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1], len(ref)


def error_rate(pairs: list[tuple[str, str]]) -> float:
    """Corpus word error rate of (reference, heard) pairs: all the errors over all the words, so a
    long sentence weighs more than a short one."""
    errors = words = 0
    for reference, heard in pairs:
        e, n = word_errors(reference, heard)
        errors, words = errors + e, words + n
    return errors / words if words else float("nan")
