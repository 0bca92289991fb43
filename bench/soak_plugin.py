"""The soak's model: the scripted tones, with a function call early in every reply.

Each reply asks for ``get_weather`` (tests/tools/weather_tools.py) after its first word, so every
turn of a soak call goes through the worker's edge tool runner (the call, the tool in the call's
loop, its output back into the conversation) while the reply is still a 1 s tone the callers
measure barge-in and turn latency on. Loaded by dotted path: ``--plugin bench.soak_plugin.ToolScripted``.
"""

from __future__ import annotations

from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

TOOL_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


class ToolScripted(ScriptedPlugin):
    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(calls=[TOOL_CALL], calls_after_words=1))
