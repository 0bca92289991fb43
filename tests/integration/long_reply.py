"""The scripted model with a reply of eight seconds (80 words of 100 ms), for ``serve --plugin``: long
enough that a reply cut short by a barge-in is told from one that simply ended, and that a caller on a
starved machine, who hears the reply seconds after it was sent, still talks over a reply in progress."""

from __future__ import annotations

from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

WORDS = 80
REPLY_MS = 100.0 * WORDS


class LongReplyPlugin(ScriptedPlugin):
    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply=" ".join(["word"] * WORDS), word_ms=REPLY_MS / WORDS))
