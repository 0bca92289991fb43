"""One conversation on a remote duplex server (vLLM-Omni's or ours).

``RemoteConversation`` assembles the pieces: ``connection`` (the socket, its tasks, resume and
replay), ``client_events`` (client events as the server's messages), ``self_acks`` (the acks
owed for a transport that does not send its own), ``answers`` (the answers to this side's own
messages, by exact ``event_id``), ``responses`` (what is known of the server's responses) and
``function_calls`` (the model's calls, each passed on once and bounded per reply).
It keeps the state those translations read, routes the server's events back to the transport,
and watches for a server that stalls mid-response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from duplex_agent.agent import metrics
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.input_audio import AppendRateAdapter
from duplex_agent.agent.remote import client_events
from duplex_agent.agent.remote.answers import ExpectedAnswers
from duplex_agent.agent.remote.connection import Connect, LostReason, ServerConnection, handshake
from duplex_agent.agent.remote.events import ServerMessageReader
from duplex_agent.agent.remote.function_calls import FunctionCalls
from duplex_agent.agent.remote.input import InputEncoder
from duplex_agent.agent.remote.options import RemoteOptions
from duplex_agent.agent.remote.outbox import Role
from duplex_agent.agent.remote.responses import ServerResponses
from duplex_agent.agent.remote.self_acks import SelfAcks
from duplex_agent.agent.remote.session import RemoteSession, tool_capabilities
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.contract import DuplexCapabilities

#: ``RemoteOptions`` is imported from here by the backends and apps that configure the client.
__all__ = ["RemoteConversation", "RemoteOptions"]

log = logging.getLogger("duplex_agent.remote")

#: Server events that end the session for good. (``session.resync_required`` on a live socket
#: only says a later resume could not replay everything: the call goes on.)
_TERMINAL_TYPES = frozenset({"session.expired", "session.replaced"})
#: A message queued for the server, with the ms of input audio it carries.
_Message = tuple[dict[str, Any], float]


class RemoteConversation(Conversation):
    """A ``Conversation`` whose session runs on a remote server (vLLM-Omni's or ours)."""

    def __init__(self, connect: Connect, ws: aiohttp.ClientWebSocketResponse, remote: RemoteSession,
                 options: RemoteOptions, *, last_seq: int = 0,
                 on_close: Callable[[RemoteConversation], None] | None = None) -> None:
        self.options = options
        self._on_close = on_close
        self._caps = tool_capabilities(remote.capabilities, tools=options.tools,
                                       replies_to_tool_output=options.replies_to_tool_output)
        answers = ExpectedAnswers()
        self._connection = ServerConnection(connect, ws, remote, options, answers, last_seq=last_seq,
                                            on_message=self._on_message, on_lost=self._on_lost)
        self._responses = ServerResponses()
        self._self_acks = SelfAcks(remote, self._responses, answers, self._queue_self_acks)
        self._calls = FunctionCalls(answers, self._connection.put)
        self._encoder = InputEncoder(remote, max_append_ms=options.max_append_ms)
        self._rates = AppendRateAdapter(self._encoder.in_rate)
        self._reader = ServerMessageReader(self._caps.output_sample_rate)
        self._events: asyncio.Queue[p.ServerEvent | None] = asyncio.Queue()
        self._configured = False  # the transport's first session.update has been forwarded
        self._first_reply_pending = False
        self._close_reason: str | None = None
        self._closing = False
        self._ended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped_late_deltas = 0
        #: Why the server was lost (a ``LostReason``); None while it was not.
        self.lost_reason: str | None = None

    @classmethod
    async def open(cls, connect: Connect, session: dict[str, Any], *, model: str, max_sessions: int,
                   options: RemoteOptions, on_close: Callable[[RemoteConversation], None] | None = None
                   ) -> RemoteConversation:
        """Connect, send ``session.update``, wait for ``session.created``; AdmissionError when refused."""
        ws, remote, last_seq = await handshake(connect, session, model=model, max_sessions=max_sessions,
                                               options=options)
        conversation = cls(connect, ws, remote, options, last_seq=last_seq, on_close=on_close)
        conversation._start()
        return conversation

    # ---- the Conversation interface ----

    @property
    def session_id(self) -> str:
        return self.remote.session_id

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self._caps

    @property
    def remote(self) -> RemoteSession:
        """The session as the server last described it (a resume renews its token)."""
        return self._connection.remote

    @property
    def resumes(self) -> int:
        """Times the session was resumed on a new socket."""
        return self._connection.resumes

    @property
    def queued_input_ms(self) -> float:
        return self._connection.queued_audio_ms

    @property
    def resume_dropped_input_ms(self) -> float:
        """Input audio a resume could not tell the server had, and did not send again."""
        return self._connection.resume_dropped_input_ms

    @property
    def resent_after_resume(self) -> int:
        """Messages written into a socket that dropped, sent again after the resume."""
        return self._connection.resent_after_resume

    @property
    def closed_here(self) -> bool:
        """``close`` was called: the session ends because this side ended it."""
        return self._close_reason is not None

    def send(self, event: p.ClientEvent) -> None:
        """Translate and queue a client event; never blocks."""
        if self._closing or self._close_reason is not None:
            return
        try:
            for message, audio_ms in self._translate(event):
                # A heartbeat is answered like this side's own: it counts as a receipt.
                role = Role.RECEIPT if message.get("type") == "session.heartbeat" else None
                if self._connection.put(message, audio_ms, role):
                    self._emit(p.ErrorEvent.of(
                        "input_backpressure", f"the duplex server is not taking input; dropped the oldest audio "
                        f"beyond {self.options.max_queued_input_ms:g} ms", error_type="server_error"))
        except p.ProtocolError as exc:
            self._emit(p.ErrorEvent.from_exception(exc))

    async def events(self) -> AsyncIterator[p.ServerEvent]:
        while (event := await self._events.get()) is not None:
            yield event
        self._events.put_nowait(None)  # later readers see the end too

    async def close(self, reason: str = "client_closed") -> None:
        """Send what is queued (a final ``playback.ack`` included), then ``session.close``; wait for ``session.closed``."""
        if self._closing or self._close_reason is not None:
            await self._ended.wait()
            return
        self._close_reason = reason
        # The session ends here: a socket that drops now is not resumed, and no ack goes out for the transport.
        self._connection.stop_resuming()
        self._self_acks.stop()
        if self.remote.extended and self._connection.socket_open:
            self._connection.put({"type": "session.close"})
            try:
                await asyncio.wait_for(asyncio.shield(self._ended.wait()), self.options.close_timeout_s)
            except TimeoutError:
                log.info("no session.closed from the duplex server within %g s", self.options.close_timeout_s)
        await self._shutdown(p.SessionClosed(reason))

    # ---- client -> server ----

    def _translate(self, event: p.ClientEvent) -> list[_Message]:
        if isinstance(event, p.InputAudioBufferAppend):
            return self._appends(self._encoder.push(self._rates.adapt(event).audio))
        if isinstance(event, p.SessionUpdate):
            return _control(self._session_update(event))
        if isinstance(event, p.InputAudioBufferCommit):
            return [*_control(*self._self_acks.owed()), *self._appends(self._encoder.flush()),
                    *_control(client_events.commit(event, self.remote))]
        if isinstance(event, p.ResponseCreate):
            client_events.check_tool_fields(event.response or {}, self._caps, event.event_id)
            return _control(*self._self_acks.owed(), client_events.wire(event))
        if isinstance(event, p.ConversationItemCreate) and event.item.get("type") == "function_call_output":
            return _control(self._calls.output(event))
        if isinstance(event, p.InputDtmf):
            self._emit(p.DtmfReceived(client_events.dtmf_digit(event)))
            return []
        if isinstance(event, p.ResponseCancel):
            return _control(*self._cancel(event))
        if isinstance(event, p.BargeIn):
            return _control(*self._cancel(p.ResponseCancel(reason="barge_in", event_id=event.event_id)))
        if isinstance(event, p.PlaybackAck):
            return _control(*self._playback_ack(event))
        if isinstance(event, p.InputAudioBufferClear):
            self._encoder.clear()
        return _control(*client_events.forwarded(event, self._caps))

    def _appends(self, packets: list[tuple[str, float]]) -> list[_Message]:
        return client_events.appends(packets, audio_format=self.remote.input_format,
                                     sample_rate_hz=self._encoder.out_rate)

    def _session_update(self, event: p.SessionUpdate) -> dict[str, Any]:
        session = client_events.check_tool_fields(event.session, self._caps, event.event_id)
        event = p.SessionUpdate(session, event_id=event.event_id)
        audio_format, rate = client_events.input_audio(
            event, current=(self._encoder.in_format, self._encoder.in_rate), started=self._configured)
        self._encoder.configure(audio_format, rate)
        self._rates.configure(rate)
        if not self._configured:
            self._configured = self._first_reply_pending = True
        return client_events.session_update(event, self.remote)

    def _cancel(self, event: p.ResponseCancel) -> list[dict[str, Any]]:
        response_id = event.response_id or self._responses.speaking
        if response_id:
            self._responses.cut.add(response_id)
        if (client_events.barge_in_ends_here(event, self._caps) and response_id
                and response_id not in self._responses.ended_here):
            self._end_response_here(response_id, "barge_in")
        return client_events.cancel(event, response_id, self.remote)

    def _playback_ack(self, event: p.PlaybackAck) -> list[dict[str, Any]]:
        response_id = event.response_id or self._responses.latest
        if response_id is None:
            return []
        self._self_acks.acked_by_transport(response_id)
        item_id = event.item_id or self._responses.item_of(response_id)
        return client_events.playback_ack(event, response_id=response_id, item_id=item_id,
                                          cut=response_id in self._responses.cut, caps=self._caps)

    def _queue_self_acks(self, messages: list[dict[str, Any]]) -> None:
        for message in messages:
            self._connection.put(message)

    # ---- server -> client ----

    def _on_message(self, data: dict[str, Any]) -> bool:
        """Handle one server message the connection passed on; True when the session has ended."""
        kind = data.get("type")
        if kind == "session.closed" and self._close_reason is not None:
            self._spawn_shutdown(p.SessionClosed(self._close_reason))
            return True
        if kind in _TERMINAL_TYPES:
            ended = f"the duplex server ended the session: {kind} {data.get('reason', '')}".strip()
            self._emit(p.ErrorEvent.of("backend_disconnected", ended, error_type="server_error"))
            self._spawn_shutdown(p.SessionClosed(str(data.get("reason") or kind)))
            return True
        for event in self._calls.screen(self._reader.read(data)):
            if isinstance(event, p.SessionClosed):
                self._spawn_shutdown(event)
                return True
            self._on_event(event)
        return False

    def _on_event(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SessionCreated):
            return  # a repeat of the one ``open`` consumed
        if isinstance(event, p.SessionUpdated):
            if not self._configured:
                return  # the answer to our own opening update
            session = {**event.session, "capabilities": self._caps.to_dict()}
            if self._first_reply_pending:
                self._first_reply_pending = False
                self._emit(p.SessionCreated(session))
            else:
                self._emit(p.SessionUpdated(session))
            return
        response_id = getattr(event, "response_id", None)
        if isinstance(event, p.OutputAudioBufferCleared) and self._self_acks.is_own_clear(event):
            return  # the answer to this side's clear: the transport's own playout goes on
        late = isinstance(event, p.ResponseAudioDelta | p.ResponseTranscriptDelta) and response_id in self._responses.cut
        if late or response_id in self._responses.ended_here:
            self.dropped_late_deltas += isinstance(event, p.ResponseAudioDelta)
            return
        if isinstance(event, p.ResponseCreated) and event.function_call is None:
            self._responses.created(event)  # a call's response is no reply: acks and cancels still mean the spoken one
        elif isinstance(event, p.ResponseAudioDelta):
            self._responses.speaking = event.response_id
            self._self_acks.heard(event)
        elif isinstance(event, p.ResponseDone | p.ResponseAudioDone) and response_id == self._responses.speaking:
            self._responses.speaking = None
        if isinstance(event, p.ResponseDone):
            self._self_acks.ended(event.response_id)
        self._emit(event)

    def _on_lost(self, close_code: int | None, reason: str) -> None:
        """The socket is gone and the session with it (or this side is closing it anyway)."""
        if self._close_reason is not None:
            self._spawn_shutdown(p.SessionClosed(self._close_reason))
            return
        self.lost_reason = reason
        metrics.BACKEND_LOST.labels(reason).inc()
        if reason == LostReason.UNRESPONSIVE:
            why = (f"the duplex server stopped answering: nothing for {self.options.unresponsive_after_s:g} s, "
                   f"not even a ping")
        else:
            why = f"lost the connection to the duplex server (close code {close_code})"
        log.warning("session %s: %s", self.session_id, why)
        self._emit(p.ErrorEvent.of("backend_disconnected", why, error_type="server_error"))
        self._spawn_shutdown(p.SessionClosed("backend_disconnected"))

    # ---- stalls ----

    async def _watch_stalls(self) -> None:
        limit = self.options.stall_timeout_s
        while True:
            await asyncio.sleep(limit / 4)
            response_id = self._responses.speaking
            silent_s = time.monotonic() - self._connection.last_event_at
            if response_id is None or silent_s <= limit:
                continue
            self._emit(p.ErrorEvent.of(
                "backend_stalled", f"no event from the duplex server for {silent_s:.1f} s while response "
                f"{response_id} played; it is cancelled", error_type="server_error"))
            self._responses.cut.add(response_id)
            self._end_response_here(response_id, "backend_stalled")
            self._connection.put({"type": "response.cancel", "response_id": response_id})

    def _end_response_here(self, response_id: str, reason: str) -> None:
        self._responses.end_here(response_id)
        self._emit(p.ResponseDone(response_id, "cancelled", reason))

    # ---- lifecycle ----

    def _start(self) -> None:
        self._connection.start()
        name = self.remote.session_id or "remote"
        self._tasks = [asyncio.create_task(self._watch_stalls(), name=f"remote-stalls-{name}")]

    def _spawn_shutdown(self, closed: p.SessionClosed) -> None:
        """Shut down from inside the reader: the shutdown runs as its own task, kept in ``_tasks``."""
        if not self._closing:
            self._tasks.append(asyncio.create_task(self._shutdown(closed), name="remote-shutdown"))

    async def _shutdown(self, closed: p.SessionClosed) -> None:
        if self._closing:
            await self._ended.wait()
            return
        self._closing = True
        self._self_acks.stop()
        current = asyncio.current_task()
        others = [task for task in self._tasks if task is not current]
        for task in others:
            task.cancel()
        await self._connection.close()  # its tasks are cancelled at once, with these
        await asyncio.gather(*others, return_exceptions=True)
        self._emit(closed)
        self._events.put_nowait(None)
        self._ended.set()
        if self._on_close is not None:
            self._on_close(self)

    def _emit(self, event: p.ServerEvent) -> None:
        if not self._ended.is_set():
            self._events.put_nowait(event)


def _control(*messages: dict[str, Any]) -> list[_Message]:
    """Messages that carry no input audio."""
    return [(message, 0.0) for message in messages]
