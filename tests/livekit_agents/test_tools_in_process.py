"""An AgentSession on our own runner with the scripted model, which calls tools: the caller's turn
makes the model call get_weather, the session runs it, the output goes back, and the model's
answer says what the tool said; with the model that answers outputs by itself, unasked."""

from __future__ import annotations

import asyncio

from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool

from devtools.speech import speak
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.livekit_agents.session import DuplexAgentSession
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.livekit_agents.tool_fakes import model_on
from tests.support.waits import until


class ScriptedBackend:
    """Our runner with a scripted plugin, in this process, its capabilities known from the start."""

    def __init__(self, script: Script) -> None:
        plugin = ScriptedPlugin(as_float32_audio, script)
        self.backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1)
        self.known_capabilities = self.backend.capabilities
        self.sent: list[p.ClientEvent] = []

    def tool_facts(self) -> tuple[bool | None, bool | None]:
        return self.known_capabilities.supports_tools, self.known_capabilities.replies_to_tool_output

    async def open(self):
        conversation = await self.backend.open()
        send = conversation.send

        def recording_send(event: p.ClientEvent) -> None:
            self.sent.append(event)
            send(event)

        conversation.send = recording_send
        return conversation

    async def close(self) -> None:
        await self.backend.close()


def _frames(audio, rate: int = 48000) -> list[rtc.AudioFrame]:
    pcm = (audio * 32767).astype("<i2")
    step = rate // 50
    return [rtc.AudioFrame(pcm[i:i + step].tobytes(), rate, 1, step) for i in range(0, len(pcm) - step + 1, step)]


class Weather(Agent):
    def __init__(self, ran: list[str]) -> None:
        super().__init__(instructions="Answer about the weather.")
        self.ran = ran

    @function_tool
    async def get_weather(self, city: str) -> str:
        """Today's weather in a city.

        Args:
            city: The city's name.
        """
        self.ran.append(city)
        return f"sunny in {city}"


async def _ask_the_weather(replies_to_tool_output: bool) -> tuple[ScriptedBackend, AgentSession, list[str]]:
    script = Script(reply="let me look", word_ms=60.0, calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
                    tool_reply="the tool says {output}", replies_to_tool_output=replies_to_tool_output)
    backend = ScriptedBackend(script)
    model = model_on(backend)
    assert model.capabilities.auto_tool_reply_generation is replies_to_tool_output
    ran: list[str] = []
    session = AgentSession(llm=model, aec_warmup_duration=None)
    model.attach(session)
    await session.start(agent=Weather(ran))
    duplex: DuplexAgentSession = session.current_agent.duplex_session
    await asyncio.wait_for(duplex._ready.wait(), 120)
    for frame in _frames(speak("What is the weather in Paris?", 48000, before_ms=200, after_ms=1500)):
        duplex.push_audio(frame)
        await asyncio.sleep(0)  # the call path takes each frame as it comes
    return backend, session, ran


def _said(session: AgentSession) -> list[str]:
    return [i.text_content or "" for i in session.history.items if i.type == "message" and i.role == "assistant"]


async def test_the_scripted_model_calls_the_tool_and_its_answer_says_the_tools_words():
    backend, session, ran = await _ask_the_weather(replies_to_tool_output=False)
    try:
        await until(lambda: any("sunny" in s for s in _said(session)), 60, "the answer with the tool's words")
        assert ran == ["Paris"]
        outputs = [e.item for e in backend.sent if isinstance(e, p.ConversationItemCreate)]
        assert [(o["type"], o["output"]) for o in outputs] == [("function_call_output", "sunny in Paris")]
        assert sum(isinstance(e, p.ResponseCreate) for e in backend.sent) == 1
        kinds = [i.type for i in session.history.items if i.type != "agent_config_update"]
        assert kinds.index("function_call") < kinds.index("function_call_output")
        assert "the tool says sunny in Paris" in _said(session)[-1]
    finally:
        await session.aclose()
        await backend.close()


async def test_a_model_that_answers_outputs_by_itself_is_not_asked():
    backend, session, ran = await _ask_the_weather(replies_to_tool_output=True)
    try:
        await until(lambda: any("sunny" in s for s in _said(session)), 60, "the answer with the tool's words")
        assert ran == ["Paris"] and not any(isinstance(e, p.ResponseCreate) for e in backend.sent)
    finally:
        await session.aclose()
        await backend.close()
