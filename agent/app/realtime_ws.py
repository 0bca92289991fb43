"""``GET /v1/realtime?duplex=1``: the duplex realtime websocket, speaking vLLM-Omni's wire.

A connection with ``?model=`` (and neither ``autostart=0`` nor ``resume=1``) opens a
session at once, before any client message, as vLLM-Omni does. Otherwise the first
message opens a session (``session.update``; any other event opens one with the
defaults and is then applied) or reattaches one (``session.resume``). Then client
events go to the conversation in arrival order. An in-process conversation answers each after
the answers to everything sent before it, as vLLM-Omni's command mailbox does,
``session.heartbeat``, ``turn.signal``, ``input.text.append`` and the cancel of a finished reply
included; in front of a remote backend this endpoint answers those four on arrival. It always
answers ``session.event_ack`` (trims the replay journal) and ``session.close``
(``session.closed``, then close 1000). Bad input gets an ``error`` with vLLM-Omni's code and the client's
``event_id``, and the session keeps serving; ``response.cancel`` after the latest reply
finished is ``response_not_active``. A socket that goes away -- dropped, or closed by the
client with any code, 1000 and 1001 included (a browser reload) -- leaves the session alive
for ``resume_grace_s`` (see ``session_store``); only ``session.close`` ends it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from duplex_agent.agent import metrics
from duplex_agent.agent.app.session_store import JournalGap, LiveSession, SessionStore
from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.omni_wire import ServerWireEncoder
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.ports import AdmissionError, DuplexBackend

log = logging.getLogger("duplex_agent.realtime")

#: vLLM-Omni's limit on one client frame (``MAX_EVENT_BYTES``); larger ones get ``event_too_large``.
MAX_EVENT_BYTES = 15 * 1024 * 1024
#: What the transport reads at all; a frame beyond it is refused by aiohttp with close 1009.
TRANSPORT_LIMIT_BYTES = 4 * MAX_EVENT_BYTES
_TRUE = ("1", "true", "on", "yes")
_DUPLEX_ON = ("", *_TRUE)
_DUPLEX_OFF = ("0", "false", "off", "no")
#: Client events this endpoint answers itself.
_TRANSPORT_EVENTS = ("session.heartbeat", "session.event_ack", "session.close", "close", "close_session",
                     "session.resume")


class RealtimeEndpoint:
    def __init__(self, backend: DuplexBackend, *, config_timeout_s: float = 10.0, resume_grace_s: float = 30.0,
                 journal_bytes: int = 8 << 20, max_event_bytes: int = MAX_EVENT_BYTES,
                 socket_backlog_bytes: int = 8 << 20, cpu_guard: CpuGuard | None = None) -> None:
        """``resume_grace_s``: how long a session outlives its socket (0: not resumable).
        ``socket_backlog_bytes``: what may wait for a socket that takes its events too slowly before it
        counts as dropped (about two minutes of 24 kHz audio). ``cpu_guard``: refuses new sessions
        while the machine is saturated."""
        self.backend = backend
        self.cpu_guard = cpu_guard
        self.config_timeout_s = config_timeout_s
        self.resume_grace_s = resume_grace_s
        self.journal_bytes = journal_bytes
        self.socket_backlog_bytes = socket_backlog_bytes
        self.max_event_bytes = max_event_bytes
        self.sessions = SessionStore()

    def register(self, app: web.Application) -> None:
        # (vLLM-Omni's /v1/duplex alias is left out: the access guard protects /v1/realtime.)
        app.router.add_get("/v1/realtime", self.handle)
        app.on_shutdown.append(lambda _app: self.sessions.close_all())

    async def handle(self, request: web.Request) -> web.StreamResponse:
        duplex = request.query.get("duplex", "").strip().lower()
        if duplex not in _DUPLEX_ON:
            reason = ("Realtime API is not available: this server serves duplex sessions only"
                      if duplex in _DUPLEX_OFF else f"unknown duplex value {duplex!r}: use ?duplex=1")
            raise web.HTTPBadRequest(text=json.dumps({"error": reason}), content_type="application/json")
        ws = web.WebSocketResponse(max_msg_size=TRANSPORT_LIMIT_BYTES, heartbeat=30.0)
        await ws.prepare(request)
        abort = _aborter(request, ws)
        live: LiveSession | None = None
        if _autostarts(request):
            live = await self._open(ws, abort, None, model=request.query["model"])
        elif (first := await self._first_message(ws)) is not None:
            live = await (self._resume(ws, abort, first) if first.get("type") == "session.resume"
                          else self._open(ws, abort, first))
        if live is None:
            await ws.close()
            return ws
        await self._serve(ws, live)
        return ws

    # ---- handshake ----

    async def _first_message(self, ws: web.WebSocketResponse) -> dict[str, Any] | None:
        try:
            message = await ws.receive(timeout=self.config_timeout_s)
        except TimeoutError:
            await _send_direct(ws, p.ErrorEvent.of("config_timeout", "Timeout waiting for session.update"))
            return None
        if message.type != WSMsgType.TEXT:
            return None
        try:
            data = json.loads(message.data)
        except ValueError:
            await _send_direct(ws, p.ErrorEvent.of("invalid_json", "Invalid JSON in session.update"))
            return None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            await _send_direct(ws, p.ErrorEvent.of("invalid_event", "a realtime event must be a JSON object with a type"))
            return None
        return data

    async def _open(self, ws: web.WebSocketResponse, abort: Callable[[], None], first: dict[str, Any] | None, *,
                    model: str = "") -> LiveSession | None:
        """Open a session with ``first`` (a ``session.update``, else the defaults and then ``first``).

        ``first`` None: the ``?model=`` autostart, with the defaults and nothing to apply after.
        """
        if first is not None and first["type"] == "session.update":
            opening = first
        else:
            opening = {"type": "session.update", "session": {"model": model} if model else {}}
        try:
            update = codec.decode_client_event(json.dumps(opening))
        except p.ProtocolError as exc:
            await _send_direct(ws, p.ErrorEvent.from_exception(exc))
            return None
        try:
            if self.cpu_guard is not None:
                self.cpu_guard.check()
            conversation = await self.backend.open()
        except AdmissionError as exc:
            log.info("a new session was refused: %s (%s)", exc.code, exc)
            metrics.SESSIONS_REFUSED.labels("websocket", exc.code).inc()
            await _send_direct(ws, p.ErrorEvent.of(exc.code, str(exc), event_id=update.event_id,
                                                   error_type="rate_limit_error"))
            return None
        conversation.client_plays_out()
        events = aiter(conversation.events())
        conversation.send(update)
        early: list[p.ServerEvent] = []
        while (reply := await anext(events, None)) is not None and not isinstance(reply, p.SessionCreated):
            if isinstance(reply, p.ErrorEvent | p.SessionClosed):
                break
            early.append(reply)
        if not isinstance(reply, p.SessionCreated):
            # A refused first update opens nothing (vLLM-Omni answers the error and closes).
            if isinstance(reply, p.ErrorEvent):
                await _send_direct(ws, reply)
            await conversation.close("session_rejected")
            return None
        resumable = self.resume_grace_s > 0
        live = LiveSession(conversation, events, journal_bytes=self.journal_bytes,
                           socket_backlog_bytes=self.socket_backlog_bytes, resumable=resumable,
                           on_closed=self.sessions.forget)
        live.attach_first(ws, abort, grace_s=self.resume_grace_s, on_expired=self._expire)
        self.sessions.add(live)
        created: dict[str, Any] = {"attachment_generation": 1}
        if resumable:
            created["resume_token"] = live.new_token()
        live.emit(reply, journal=False, **created)
        live.emit(p.SessionUpdated(reply.session))  # vLLM-Omni echoes the opening update
        for event in early:
            live.emit(event)
        live.start_pump()
        if first is not None and first is not opening:
            await self._on_text(live, json.dumps(first))
        return live

    async def _resume(self, ws: web.WebSocketResponse, abort: Callable[[], None],
                      first: dict[str, Any]) -> LiveSession | None:
        try:
            request = codec.decode_client_event(json.dumps(first))
        except p.ProtocolError:
            request = None
        if not isinstance(request, p.SessionResume) or not request.session_id or not request.resume_token \
                or request.last_received_server_event_seq < 0:
            await _send_direct(ws, p.ErrorEvent.of("invalid_session_resume", "session.resume requires session_id, "
                                                   "resume_token, and a non-negative last_received_server_event_seq",
                                                   event_id=first.get("event_id")))
            return None
        live = self.sessions.get(request.session_id) if self.resume_grace_s > 0 else None
        if live is None:
            await _send_direct(ws, p.ErrorEvent.of("session_resume_expired", "Unknown or expired duplex session: "
                                                   f"{request.session_id}", event_id=request.event_id))
            return None
        if not live.token_matches(request.resume_token):
            await _send_direct(ws, p.ErrorEvent.of("invalid_resume_token", "Invalid duplex session resume token",
                                                   event_id=request.event_id))
            return None
        try:
            # At once, whatever the previous socket is doing: its writer is ended on its own task.
            live.attach(ws, abort, request.last_received_server_event_seq)
        except JournalGap:
            await _send_direct(ws, p.SessionResyncRequired(live.session_id, "journal_gap"))
            return None
        except ValueError as exc:
            await _send_direct(ws, p.ErrorEvent.of("session_resume_conflict", str(exc), event_id=request.event_id))
            return None
        log.info("session %s resumed after seq %d", live.session_id, request.last_received_server_event_seq)
        return live

    # ---- serving ----

    async def _serve(self, ws: web.WebSocketResponse, live: LiveSession) -> None:
        try:
            async for message in ws:
                if live.ws is not ws:
                    # A resume took the session over: what still arrives here would land after the new
                    # socket's events, out of order. vLLM-Omni drops it too (``is_current_attachment``),
                    # and a resuming client sends again whatever its receipts do not cover.
                    break
                if message.type == WSMsgType.TEXT:
                    await self._on_text(live, message.data)
                elif message.type == WSMsgType.BINARY:
                    live.emit(p.ErrorEvent.of("invalid_event", "send events as JSON text frames"))
                elif message.type == WSMsgType.ERROR:
                    log.info("websocket error: %s", ws.exception())
                    break
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the connection is lost: the session must outlive it.
            self._socket_gone(ws, live)
            raise
        if live.closing or live.closed.is_set():
            await live.closed.wait()
        else:
            self._socket_gone(ws, live)

    def _socket_gone(self, ws: web.WebSocketResponse, live: LiveSession) -> None:
        if live.closing or live.ending or live.closed.is_set():
            return
        if live.detach(ws) and self.resume_grace_s > 0:
            log.info("session %s: its socket dropped; kept %g s for a resume", live.session_id, self.resume_grace_s)

    async def _expire(self, live: LiveSession) -> None:
        await live.shutdown("disconnect_grace_expired")

    async def _on_text(self, live: LiveSession, text: str) -> None:
        if len(text) > self.max_event_bytes or len(text.encode()) > self.max_event_bytes:
            live.emit(p.ErrorEvent.of("event_too_large", f"a frame may carry at most {self.max_event_bytes} "
                                            "bytes"))
            return
        try:
            data = json.loads(text)
        except ValueError:
            live.emit(p.ErrorEvent.of("invalid_json", "Invalid JSON event"))
            return
        kind = data.get("type") if isinstance(data, dict) else None
        if kind in _TRANSPORT_EVENTS:
            await self._transport_event(live, data)
            return
        try:
            event = codec.decode_client_event(text, audio_format=live.input_format)
        except p.ProtocolError as exc:
            live.emit(p.ErrorEvent.from_exception(exc))
            return
        if isinstance(event, p.InputAudioBufferAppend):
            event = live.rates.adapt(event)
        elif isinstance(event, p.TurnSignal) and not live.conversation.answers_wire_controls:
            live.emit(p.TurnEvent(event.event, "accepted"))
            return
        elif (isinstance(event, p.ResponseCancel) and not live.conversation.answers_wire_controls
              and _finished(live, event.response_id)):
            # vLLM-Omni's answer (``resolve_cancel_response``): the reply is over, nothing is cleared.
            live.emit(p.ErrorEvent.of("response_not_active", f"Response is already complete: "
                                            f"{live.encoder.last_response}", event_id=event.event_id))
            return
        elif isinstance(event, p.InputTextAppend) and not live.conversation.answers_wire_controls:
            live.emit(p.ErrorEvent.of(*p.TEXT_APPEND_REFUSED, event_id=event.event_id))
            return
        live.conversation.send(event)

    async def _transport_event(self, live: LiveSession, data: dict[str, Any]) -> None:
        try:
            event = codec.decode_client_event(json.dumps(data))
        except p.ProtocolError as exc:
            code = "invalid_event_ack" if data["type"] == "session.event_ack" else exc.code
            live.emit(p.ErrorEvent.of(code, str(exc), event_id=exc.event_id))
            return
        if isinstance(event, p.SessionHeartbeat):
            if live.conversation.answers_wire_controls:
                live.conversation.send(event)  # answered in order, as vLLM-Omni answers it
            else:
                live.emit(p.SessionHeartbeatAck(live.session_id))
        elif isinstance(event, p.SessionEventAck):
            try:
                live.journal.acknowledge(event.server_event_seq)
            except ValueError as exc:
                live.emit(p.ErrorEvent.of("invalid_event_ack", str(exc), event_id=event.event_id))
        elif isinstance(event, p.SessionClose):
            live.closing = True
            await live.shutdown(event.reason)
        else:
            live.emit(p.ErrorEvent.of("unsupported_session_resume", "session.resume must be the first message "
                                            "of a new connection", event_id=event.event_id))


def _aborter(request: web.Request, ws: web.WebSocketResponse) -> Callable[[], None]:
    """Drops the request's connection at once (a socket whose peer reads nothing cannot be closed politely)."""
    transport = request.transport

    def abort() -> None:
        if transport is not None:
            transport.abort()
        else:  # already detached from its connection: a close is all there is
            asyncio.get_running_loop().create_task(ws.close())

    return abort


def _autostarts(request: web.Request) -> bool:
    """vLLM-Omni's ``initial_open_payload``: ``?model=`` opens at once unless ``autostart=0`` or ``resume=1``."""
    query = request.query
    resume_only = (query.get("resume", "").strip().lower() in _TRUE
                   or query.get("autostart", "").strip().lower() in _DUPLEX_OFF)
    return bool(query.get("model")) and not resume_only


def _finished(live: LiveSession, response_id: str | None) -> bool:
    """The cancel names the latest reply (or none), and that reply has finished (as the client was told)."""
    encoder = live.encoder
    return (encoder.last_response is not None and not encoder.response_active
            and response_id in (None, encoder.last_response))


async def _send_direct(ws: web.WebSocketResponse, event: p.ServerEvent) -> None:
    """An event outside any session's numbered stream (handshake errors, ``session.replaced``)."""
    if isinstance(event, p.ErrorEvent):
        metrics.ERRORS.labels(event.code).inc()
    if ws.closed:
        return
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(json.dumps(ServerWireEncoder("").encode(event), separators=(",", ":")))

