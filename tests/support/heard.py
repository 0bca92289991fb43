"""Whether a caller heard a reply, from Whisper's words of what reached them."""

from __future__ import annotations

import numpy as np

from devtools.speech import transcribe, words

#: Share of a reply's words a caller must be heard to have heard. Whisper, run on audio that went
#: through the reference voice, Opus and a loaded machine's playout, now and then writes a short
#: word or two as others ("You said a" as "He used a dead"); a reply not heard loses most words.
HEARD_SHARE = 0.7
#: The same for a phone: Whisper mishears many more words through a phone line's 8 kHz G.711
#: (bench.asr_accuracy's phone figures), so half of a reply's words say it was heard.
PHONE_HEARD_SHARE = 0.5


def reply_heard(heard: str, reply: str, share: float = HEARD_SHARE) -> bool:
    """Whether at least ``share`` of ``reply``'s distinct words are among the words of ``heard``."""
    expected = set(words(reply))
    return bool(expected) and len(expected & set(words(heard))) >= share * len(expected)


def heard_to_the_end(heard: str, said: str, share: float = HEARD_SHARE) -> bool:
    """``reply_heard``, and its last word among them or as many words heard as were said: what was
    said reached the caller whole, not cut before its end. (Whisper now and then writes a reply's
    last word as another, "Have a nice day" as "Have a nice night" on a phone line; a reply cut
    short loses words.)"""
    said_words, heard_words = words(said), words(heard)
    whole = set(said_words[-1:]) <= set(heard_words) or len(heard_words) >= len(said_words)
    return reply_heard(heard, said, share) and whole


def phone_heard(call, since: float = 0.0, until: float | None = None) -> str:
    """What a loopback phone (its ``CallRecord``) heard down its line from ``since`` to ``until``
    (monotonic s), as Whisper writes it; "" when none of it was loud (Whisper makes words of a
    quiet line)."""
    audio = call.heard_audio(since, until)
    if not (audio.size and float(np.abs(audio).max()) > 0.05):
        return ""
    return transcribe(audio, call.rate)


def loud_since(call, since: float) -> list[float]:
    """When a loopback phone heard loud frames down its line, from ``since`` (monotonic s)."""
    return [h.at for h in call.heard if h.at >= since and float(np.abs(h.samples).max()) > 0.05]


def spoken_to_first(call, waited_s: float) -> None:
    """The loopback phone of ``call``, which said nothing, heard the agent ask whether it can be
    heard, and not before ``waited_s`` after it answered."""
    heard = words(phone_heard(call))
    assert "hear" in heard, heard
    first = loud_since(call, 0.0)[0] - call.answered_at
    assert first >= waited_s, f"the agent spoke {first:.2f} s after the answer"


def replied_and_quiet(call, quiet_s: float = 1.0) -> bool:
    """A loopback phone (its ``CallRecord``, or None before the call) heard the agent speak, and
    nothing loud for ``quiet_s`` since."""
    loud = loud_since(call, 0.0) if call is not None else []
    return bool(loud) and call.heard[-1].at - loud[-1] >= quiet_s
