"""The scripted model with a reply of thirty seconds (300 words of 100 ms), for ``serve --plugin``: long
enough that a reply cut short by a barge-in is told from one that simply ended, and that on a starved
machine, where the caller hears the reply seconds after it was sent and the worker hears the caller
seconds after that, the interruption still reaches the worker while its reply goes on."""

from __future__ import annotations

from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

WORDS = 300
REPLY_MS = 100.0 * WORDS


class LongReplyPlugin(ScriptedPlugin):
    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply=" ".join(["word"] * WORDS), word_ms=REPLY_MS / WORDS))
