"""The scripted models the tool bench's LiveKit Agents app runs: the same voice and pace, one
answering the weather question through a get_weather call, the other answering it outright."""

from __future__ import annotations

from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

ANSWER = "the tool says {output}"
#: What the tool returns; the plain model says the same words as the tool-calling one.
TOOL_OUTPUT = "sunny and 21 degrees in Paris"


class ToolCallingScripted(ScriptedPlugin):
    """Says nothing first: its one call is the turn's response, its answer the first sound."""

    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply="", calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
                                              tool_reply=ANSWER))


class PlainScripted(ScriptedPlugin):
    """The same answer, with no tool."""

    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply=ANSWER.format(output=TOOL_OUTPUT)))
