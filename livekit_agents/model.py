"""``DuplexModel``: a duplex-agent backend as a LiveKit Agents model.

``DuplexModel(url)`` talks to a duplex-agent or vLLM-Omni server over the realtime duplex
websocket (``agent/remote``: the exact wire, heartbeats, resume). ``DuplexModel.in_process``
runs our session runner and a plugin in the worker's own process, one load shared by every
job thread. ``AgentSession(llm=DuplexModel(...))`` is all an app needs; pass
``aec_warmup_duration=None`` so the caller's first words over the agent reach the model.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from livekit.agents import llm
from livekit.agents.job import JobExecutorType, get_job_context

from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.livekit_agents.backends import InProcessBackend, RemoteModelBackend
from duplex_agent.livekit_agents.gate import ResponseGate
from duplex_agent.livekit_agents.session import DuplexAgentSession, SessionPlan

if TYPE_CHECKING:
    from livekit.agents import AgentSession

API_KEY_ENV = "DUPLEX_API_KEY"


def livekit_capabilities(replies_to_tool_output: bool | None) -> llm.DuplexCapabilities:
    """What a duplex-agent backend can do, as livekit-agents asks it; ``replies_to_tool_output``
    as far as the backend's model is known (None: a server no session has opened on yet)."""
    return llm.DuplexCapabilities(
        user_transcription=True,
        # the model answers its tools' outputs by itself, or waits for response.create
        auto_tool_reply_generation=bool(replies_to_tool_output),
        mutable_chat_context=True,  # text messages and tool outputs, as conversation.item.create
        mutable_instructions=True,  # session.update
        mutable_tools=True,  # session.update; a model that cannot call tools refuses them (ToolsUnsupportedError)
    )


class DuplexModel(llm.DuplexModel):
    def __init__(self, url: str, *, api_key: str | None = None, session: dict[str, Any] | None = None,
                 options: RemoteOptions | None = None) -> None:
        """A model on a duplex realtime websocket (``ws://host:port/v1/realtime?duplex=1``).

        ``api_key`` defaults to ``DUPLEX_API_KEY``; ``session`` (the wire's ``session.update``
        fields, ours or vLLM-Omni's) is merged into every session's first ``session.update``;
        its ``overlap_policy`` ("barge_in", the default, or "listen") is also the edge's.
        ``options``: the client's timeouts (``agent.remote.conversation.RemoteOptions``), and, for a
        vLLM-Omni server, which names no tool capability, whether its model calls tools and answers
        their outputs by itself (``RemoteOptions(tools=True, replies_to_tool_output=...)``).
        """
        backend = RemoteModelBackend(url, api_key=os.environ.get(API_KEY_ENV, "") if api_key is None else api_key,
                                     session=dict(session or {}), options=options)
        self._setup(backend, session, name=url, opening_update={})  # the remote backend sends ``session`` itself

    @classmethod
    def in_process(cls, plugin: str, *, session: dict[str, Any] | None = None, **plugin_options: Any) -> DuplexModel:
        """Our local backend in this worker: ``plugin`` is "reference", "moshi" or a dotted path.

        ``session`` is as for ``DuplexModel(url, session=...)``: every session opens with it.
        ``plugin_options`` are the plugin's own options (its ``options_type``: for Moshi,
        ``MoshiOptions``' ``moshi_config="tiny"``, ``device``...) and the worker's settings
        (``max_sessions``...). The model loads once per process, starting now on a thread, and
        every job thread shares it: run the worker with ``job_executor_type=JobExecutorType.THREAD``.
        """
        model = cls.__new__(cls)
        backend = InProcessBackend(plugin, plugin_options)
        model._setup(backend, session, name=plugin, opening_update=dict(session or {}))
        backend.preload()
        return model

    def _setup(self, backend: RemoteModelBackend | InProcessBackend, session: dict[str, Any] | None, *,
               name: str, opening_update: dict[str, Any]) -> None:
        """What both constructors set: the one place a new attribute goes."""
        llm.DuplexModel.__init__(self, capabilities=livekit_capabilities(backend.tool_facts()[1]))
        session = session or {}
        self.overlap_policy = str(session.get("overlap_policy", "barge_in"))
        self.turn_detection = session.get("turn_detection")
        self._opening_update = opening_update  # session.update fields each session sends as it opens
        self._backend = backend
        self._model_name = name
        self._attached: weakref.WeakSet[AgentSession] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._gates: dict[int, ResponseGate] = {}  # thread -> the gate made for its next session

    @property
    def capabilities(self) -> llm.DuplexCapabilities:
        """As the backend's model has them: an in-process plugin's from the start, a server's once a
        session has opened on it (before that, ``RemoteOptions``' word). livekit-agents reads them
        as an AgentSession is built; one built before a server is known is told its model waits to
        be asked to answer tool outputs, and where the model answers by itself, that answer is taken
        as the one asked for."""
        return livekit_capabilities(self._backend.tool_facts()[1])

    @property
    def calls_tools(self) -> bool | None:
        """Whether the model can call an Agent's tools (one that cannot refuses them with
        ``ToolsUnsupportedError``); None for a server no session has opened on yet, unless
        ``RemoteOptions(tools=...)`` says."""
        return self._backend.tool_facts()[0]

    @property
    def model(self) -> str:
        return self._model_name

    @property
    def provider(self) -> str:
        return "duplex-agent"

    def attach(self, session: AgentSession) -> None:
        """Name the AgentSession that runs this model, for an app that starts it outside a job."""
        with self._lock:
            self._attached.add(session)

    def audio_gate(self) -> ResponseGate:
        # the adapter asks for the gate, then for the session, on the same thread
        gate = ResponseGate()
        with self._lock:
            self._gates[threading.get_ident()] = gate
        return gate

    def session(self) -> DuplexAgentSession:
        if isinstance(self._backend, InProcessBackend):
            ctx = get_job_context(required=False)
            if ctx is not None and ctx.proc.executor_type != JobExecutorType.THREAD:
                raise llm.RealtimeError(
                    "DuplexModel.in_process shares one model load between the jobs of a process, so it "
                    "needs livekit-agents' thread executor: AgentServer(job_executor_type=JobExecutorType.THREAD)")
        with self._lock:
            gate = self._gates.pop(threading.get_ident(), None) or ResponseGate()
        plan = SessionPlan(self._backend, overlap_policy=self.overlap_policy, turn_detection=self.turn_detection,
                           opening_update=self._opening_update, attached=self._attached)
        return DuplexAgentSession(self, plan, gate=gate)

    async def aclose(self) -> None:
        await self._backend.close()
