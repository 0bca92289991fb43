"""The scripted model as a LiveKit Agents app loads it by its dotted path: each caller turn is
answered "let me look", then a call to get_weather for Paris; the tool's output is answered
"the tool says OUTPUT"."""

from __future__ import annotations

from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin


class WeatherScriptedPlugin(ScriptedPlugin):
    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply="let me look", calls=[{"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}],
                                              tool_reply="the tool says {output}"))
