"""Where a ``DuplexModel``'s conversations run: a duplex websocket, or this process.

Both hand out ``Conversation``s (``agent/session/ports.py``) opened in the calling job's
loop. The in-process backend is one per plugin and options for the whole process: every
job thread of a livekit-agents worker shares its one model load and one engine.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
from typing import Any

from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.agent.session.ports import Conversation, DuplexBackend
from duplex_agent.livekit_agents.plugin_options import build_plugin_backend, plugin_capabilities
from duplex_agent.plugins.contract import DuplexCapabilities

log = logging.getLogger("duplex_agent.livekit_agents")
#: The remote backend admits what the server admits: a full server answers with its own code.
_REMOTE_SESSIONS = 1 << 16


class RemoteModelBackend:
    """Conversations on a duplex realtime websocket (``/v1/realtime?duplex=1``), resumed when dropped."""

    def __init__(self, url: str, *, api_key: str, session: dict[str, Any], options: RemoteOptions | None) -> None:
        self.backend = RemoteBackend(url, api_key=api_key, max_sessions=_REMOTE_SESSIONS, session=session,
                                     options=options)

    @property
    def known_capabilities(self) -> DuplexCapabilities | None:
        """The server's model, once a session has opened on it (the server says in ``session.created``)."""
        return self.backend.capabilities if self.backend.started else None

    def tool_facts(self) -> tuple[bool | None, bool | None]:
        """Whether the model calls tools, and answers their outputs by itself: the server's word once
        known, before that the operator's (``RemoteOptions.tools``, ``replies_to_tool_output``: a
        vLLM-Omni server names no such capability), else None."""
        if self.backend.started:
            known = self.backend.capabilities
            return known.supports_tools, known.replies_to_tool_output
        return self.backend.options.tools, self.backend.options.replies_to_tool_output

    async def open(self) -> Conversation:
        return await self.backend.open()

    async def close(self) -> None:
        """Each session closes its own conversation, in its own loop: nothing is shared to close."""


class InProcessBackend:
    """Our session runner and a plugin in this process, loaded once and shared by every job thread."""

    _lock = threading.Lock()
    _loaded: dict[str, DuplexBackend] = {}

    def __init__(self, plugin: str, options: dict[str, Any]) -> None:
        # a bad option is the caller's TypeError now, not a job's later
        self.known_capabilities: DuplexCapabilities | None = plugin_capabilities(plugin, options)
        self.plugin = plugin
        self.options = dict(options)
        self._key = json.dumps([plugin, self.options], sort_keys=True, default=repr)

    def tool_facts(self) -> tuple[bool | None, bool | None]:
        """Whether the plugin calls tools, and answers their outputs by itself (known from the start)."""
        known = self.known_capabilities
        return (None, None) if known is None else (known.supports_tools, known.replies_to_tool_output)

    def shared(self) -> DuplexBackend:
        """The process's backend for this plugin and options, loading it on first use (blocks)."""
        with InProcessBackend._lock:  # one load even when two jobs start at once
            backend = InProcessBackend._loaded.get(self._key)
            if backend is None:
                if not InProcessBackend._loaded:
                    # at the threads' exit, which comes before the executors' (closing awaits one);
                    # a plain atexit hook runs too late for that
                    getattr(threading, "_register_atexit", atexit.register)(InProcessBackend._close_all)
                backend = InProcessBackend._loaded[self._key] = build_plugin_backend(self.plugin, self.options)
            return backend

    @staticmethod
    def _close_all() -> None:
        """At exit: stop the engines (a frame engine's clock thread must not run into the interpreter's end)."""
        with InProcessBackend._lock:
            loaded, InProcessBackend._loaded = list(InProcessBackend._loaded.values()), {}
        for backend in loaded:
            try:
                asyncio.run(backend.close())
            except Exception:
                log.exception("closing the in-process backend failed")

    def preload(self) -> None:
        """Start loading now, on a thread of its own, so the first call does not wait for it."""
        threading.Thread(target=self._preload, name="duplex-model-load", daemon=True).start()

    def _preload(self) -> None:
        try:
            self.shared()
        except Exception:  # the first session's open reports it, with its code
            log.exception("loading %s failed", self.plugin)

    async def open(self) -> Conversation:
        backend = await asyncio.to_thread(self.shared)
        return await backend.open()

    async def close(self) -> None:
        """The shared engine outlives any one model object: it is closed as the process exits."""
