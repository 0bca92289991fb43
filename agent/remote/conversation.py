"""One conversation on a remote duplex server: one websocket, three owned tasks.

The reader decodes server events (and resumes the session after a dropped
connection when the server supports it), the writer drains a bounded queue of
outgoing messages, and the watchdog notices a server that stalls mid-response.
Client events are translated per the server's capabilities on their way out.

vLLM-Omni 0.30.0 keeps a reply active until its playback is acknowledged (whatever policy the
client asks for, its session runner sets ``ack_only``), so a transport that never sends ``playback.ack``
would get ``response_already_active`` on its next turn. This side therefore
acknowledges every reply the transport has not: when its audio has had time to
play out, or at once before the transport's next ``response.create`` or commit,
with what the caller can have heard by then.

Under ``ack_only`` vLLM-Omni counts its latest reply as still playing while the acknowledged
playback is short of the audio it sent: new input is then overlap, and a commit is only
recorded, never answered. Only a full ack or a cancel frees the turn. So an ack of ours
that commits less than a finished reply is followed by ``output_audio_buffer.clear``, the
cancel that keeps the caller's buffered input (``barge_in`` drops it, ``response.cancel``
refuses a finished reply) and commits the history at the acknowledged point. A transport's
own ack is passed on as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import INPUT_FORMATS, SUPPORTED_RATES, parse_audio_format
from duplex_agent.agent.protocol.input_audio import AppendRateAdapter
from duplex_agent.agent.remote.events import ServerMessageReader
from duplex_agent.agent.remote.input import InputEncoder, OutgoingQueue
from duplex_agent.agent.remote.outbox import RECEIPT_EVENT_PREFIX, Outgoing, Role, SentLog
from duplex_agent.agent.remote.session import RemoteSession, parse_session_created, translate_session_update
from duplex_agent.agent.session.ports import AdmissionError, Conversation
from duplex_agent.plugins.contract import DuplexCapabilities

log = logging.getLogger("duplex_agent.remote")

Connect = Callable[..., Awaitable[aiohttp.ClientWebSocketResponse]]
#: Resume errors after which trying again cannot help (vLLM-Omni's codes).
FATAL_RESUME_CODES = frozenset({"invalid_session_resume", "session_resume_expired", "unsupported_session_resume",
                                "invalid_resume_token", "session_resume_conflict"})
#: Server events that end the session for good. (``session.resync_required`` on a live socket
#: only says a later resume could not replay everything: the call goes on.)
_TERMINAL_TYPES = frozenset({"session.expired", "session.replaced"})
#: The ``event_id`` of the heartbeat sent right after ``session.created``: every ``session.updated``
#: before its answer is the echo of the opening update, not a reply to the transport's.
_OPENING_BARRIER = "evt_opening_barrier"
DTMF_DIGITS = frozenset("0123456789*#ABCD")
#: ``event_id`` prefix of the acks this side sends for the transport; errors answering them stay here.
_SELF_ACK = "evt_self_ack"
#: After a reply's audio should have played out, how long to wait for the transport's own ack.
_SELF_ACK_MARGIN_S = 0.5
#: ``event_id`` (and item id) of the ``conversation.item.retrieve`` sent first on a resumed socket.
#: The server takes it after everything the old socket delivered, and answers it by name
#: (``item_not_found``, both vLLM-Omni and ours): when that answer is in, so are the receipts
#: for the old socket, and the sent log knows what to send again.
_RESUME_PROBE = "evt_resume_probe"


def real_time_heard_ms(received_ms: float, first_at: float, now: float) -> float:
    """What a caller playing a reply in real time since its first audio arrived (at ``first_at``) can
    have heard of the ``received_ms`` that arrived, by ``now``."""
    return min(received_ms, 1000.0 * (now - first_at))


@dataclass(slots=True)
class _Playback:
    """A reply's audio as received, for acknowledging it when the transport does not."""

    item_id: str
    first_at: float
    received_ms: float = 0.0
    done: bool = False
    timer: asyncio.TimerHandle | None = None

    def heard_ms(self, now: float) -> float:
        return real_time_heard_ms(self.received_ms, self.first_at, now)


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    #: The websocket handshake (TCP, TLS, HTTP upgrade).
    connect_timeout_s: float = 5.0
    open_timeout_s: float = 10.0
    #: Input audio the outgoing queue may hold while the server is slow; older audio is dropped.
    max_queued_input_ms: float = 2000.0
    #: No server event for this long while a response plays: the response is cancelled here.
    stall_timeout_s: float = 3.0
    #: How long to keep trying to resume a dropped session (vLLM-Omni keeps one for 30 s).
    resume_window_s: float = 30.0
    #: First resume delay; doubles per try up to 2 s.
    resume_backoff_s: float = 0.2
    #: ``session.heartbeat`` period, which keeps a vLLM-Omni session's lease (its client's default).
    heartbeat_interval_s: float = 30.0
    #: How long ``close`` waits for the server's ``session.closed`` after the queued messages.
    close_timeout_s: float = 2.0
    #: Longest input append (a longer model unit goes in equal slices).
    max_append_ms: float = 100.0
    #: Acknowledge received events every this many, so a resuming server can trim its journal.
    event_ack_every: int = 50
    #: A resume whose connect is refused or times out gives up at once: the host is gone, and a
    #: pool of backends moves the call to another instead of waiting out ``resume_window_s``.
    resume_gives_up_unreachable: bool = False
    #: A receipt (``session.heartbeat``) after this much input audio, so at most this much is of
    #: unknown fate when the socket drops (see ``outbox``).
    receipt_every_ms: float = 200.0


class _RecentIds:
    """A bounded set of response ids (the newest ``limit``)."""

    def __init__(self, limit: int = 256) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, key: str) -> None:
        self._ids[key] = None
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._ids


async def _first_message(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> dict[str, Any] | None:
    """The next JSON object on ``ws``; None when it closed. Non-JSON text is skipped."""
    while True:
        message = await ws.receive(timeout=timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.ERROR):
                return None
            continue
        try:
            data = json.loads(message.data)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data


class RemoteConversation(Conversation):
    """A ``Conversation`` whose session runs on a remote server (vLLM-Omni's or ours)."""

    def __init__(self, connect: Connect, ws: aiohttp.ClientWebSocketResponse, remote: RemoteSession,
                 options: RemoteOptions, *, last_seq: int = 0,
                 on_close: Callable[[RemoteConversation], None] | None = None) -> None:
        self._connect = connect
        self._ws = ws
        self.remote = remote
        self.options = options
        self._on_close = on_close
        self._caps = remote.capabilities
        self._encoder = InputEncoder(remote, max_append_ms=options.max_append_ms)
        self._outgoing = OutgoingQueue(options.max_queued_input_ms)
        self._reader = ServerMessageReader(self._caps.output_sample_rate)
        self._events: asyncio.Queue[p.ServerEvent | None] = asyncio.Queue()
        self._connected = asyncio.Event()
        self._connected.set()
        self._last_seq = last_seq
        self._events_unacked = 0
        self._last_event_at = time.monotonic()
        self._configured = False  # the transport's first session.update has been forwarded
        self._first_reply_pending = False
        self._opening_echo_window = remote.extended  # until the opening barrier's answer
        self._resumable = remote.capabilities.supports_resume and bool(remote.resume_token)
        self._sent = SentLog(options.receipt_every_ms)  # only while resumable
        self._probes = 0
        self._writing = asyncio.Lock()  # held while a message is written: a resume swaps sockets between writes
        self._rates = AppendRateAdapter(self._encoder.in_rate)
        self._close_reason: str | None = None
        self._speaking: str | None = None  # response whose audio is arriving
        self._items: dict[str, str] = {}  # response -> item
        self._last_response: str | None = None
        self._cut = _RecentIds()  # responses the edge stopped: their late audio is dropped
        self._ended_here = _RecentIds()  # responses this side ended: all their later events are dropped
        self._unacked: dict[str, _Playback] = {}  # replies with audio that the transport has not acknowledged
        self._self_acks = 0
        self._released = _RecentIds()  # finished replies this side cleared after a partial ack
        self._closing = False
        self._ended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped_late_deltas = 0
        self.resumes = 0

    @classmethod
    async def open(cls, connect: Connect, session: dict[str, Any], *, model: str, max_sessions: int,
                   options: RemoteOptions, on_close: Callable[[RemoteConversation], None] | None = None
                   ) -> RemoteConversation:
        """Connect, send ``session.update``, wait for ``session.created``; AdmissionError when refused."""
        ws = await connect(resume=False)
        try:
            await ws.send_str(json.dumps({"type": "session.update", "session": session}))
            data = await _first_message(ws, options.open_timeout_s)
            while data is not None and data.get("type") not in ("session.created", "error"):
                data = await _first_message(ws, options.open_timeout_s)
            if data is None:
                raise AdmissionError(f"the duplex server closed the connection before creating a session "
                                     f"(close code {ws.close_code})", code="backend_refused")
            if data["type"] == "error":
                error = next(iter(ServerMessageReader(0).read(data)), None)
                code = error.code if isinstance(error, p.ErrorEvent) else "backend_refused"
                message = error.error.get("message") if isinstance(error, p.ErrorEvent) else ""
                raise AdmissionError(f"the duplex server refused the session: {code}: {message}", code=code)
            remote = parse_session_created(data, model=model, max_sessions=max_sessions)
        except TimeoutError:
            await ws.close()
            raise AdmissionError(f"no session.created within {options.open_timeout_s:g} s",
                                 code="backend_timeout") from None
        except p.ProtocolError as exc:
            await ws.close()
            raise AdmissionError(f"unusable session.created: {exc}", code=exc.code) from None
        except BaseException:
            await ws.close()
            raise
        seq = data.get("server_event_seq")
        conversation = cls(connect, ws, remote, options, last_seq=seq if isinstance(seq, int) else 0,
                           on_close=on_close)
        if remote.extended:
            conversation._outgoing.put(Outgoing(json.dumps({"type": "session.heartbeat", "event_id": _OPENING_BARRIER}),
                                                role=Role.RECEIPT))
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
    def queued_input_ms(self) -> float:
        return self._outgoing.audio_ms

    @property
    def resume_dropped_input_ms(self) -> float:
        """Input audio a resume could not tell the server had, and did not send again."""
        return self._sent.dropped_audio_ms

    @property
    def resent_after_resume(self) -> int:
        """Messages written into a socket that dropped, sent again after the resume."""
        return self._sent.resent

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
                if self._outgoing.put(Outgoing(json.dumps(message, separators=(",", ":")), audio_ms, role)):
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
        if self.remote.extended and not self._ws.closed:
            self._outgoing.put(Outgoing('{"type":"session.close"}'))
            try:
                await asyncio.wait_for(asyncio.shield(self._ended.wait()), self.options.close_timeout_s)
            except TimeoutError:
                log.info("no session.closed from the duplex server within %g s", self.options.close_timeout_s)
        await self._shutdown(p.SessionClosed(reason))

    # ---- client -> server ----

    def _translate(self, event: p.ClientEvent) -> list[tuple[dict[str, Any], float]]:
        if isinstance(event, p.InputAudioBufferAppend):
            return self._appends(self._encoder.push(self._rates.adapt(event).audio))
        if isinstance(event, p.SessionUpdate):
            return [self._session_update(event)]
        if isinstance(event, p.InputAudioBufferCommit):
            commit = _wire(event)
            if self.remote.extended and event.response_create is None:
                commit["response_create"] = True  # vLLM-Omni's default is false: no reply would follow
            return [*self._self_ack_all(), *self._appends(self._encoder.flush()), (commit, 0.0)]
        if isinstance(event, p.ResponseCreate):
            return [*self._self_ack_all(), (_wire(event), 0.0)]
        if isinstance(event, p.InputDtmf):
            # Our extension: answered here, never sent (vLLM-Omni would answer unknown_event).
            if event.digit not in DTMF_DIGITS:
                raise p.ProtocolError("invalid_field", f"DTMF digit must be one of {''.join(sorted(DTMF_DIGITS))}",
                                      event_id=event.event_id)
            self._emit(p.DtmfReceived(event.digit))
            return []
        if isinstance(event, p.InputAudioBufferClear):
            self._encoder.clear()
        elif isinstance(event, p.ResponseCancel):
            return self._cancel(event)
        elif isinstance(event, p.BargeIn):
            return self._cancel(p.ResponseCancel(reason="barge_in", event_id=event.event_id))
        elif isinstance(event, p.PlaybackAck):
            return self._playback_ack(event)
        elif isinstance(event, p.ConversationItemTruncate) and not self._caps.supports_truncation:
            log.debug("the server cannot truncate items; dropping %s", event.type)
            return []
        return [(_wire(event), 0.0)]

    def _appends(self, packets: list[tuple[str, float]]) -> list[tuple[dict[str, Any], float]]:
        """Server appends, each naming its format and rate (vLLM-Omni honours both per append)."""
        return [({"type": "input_audio_buffer.append", "audio": audio, "format": self.remote.input_format,
                  "sample_rate_hz": self._encoder.out_rate}, ms) for audio, ms in packets]

    def _session_update(self, event: p.SessionUpdate) -> tuple[dict[str, Any], float]:
        update = event.session
        audio_format = parse_audio_format(update.get("input_audio_format", self._encoder.in_format))[0]
        rate = update.get("input_sample_rate", update.get("sample_rate_hz", self._encoder.in_rate))
        if self._configured and (audio_format, rate) != (self._encoder.in_format, self._encoder.in_rate):
            raise p.ProtocolError("session_field_immutable", "the input audio format and rate cannot change "
                                  "after the session started", event_id=event.event_id)
        if audio_format not in INPUT_FORMATS:
            raise p.ProtocolError("unsupported_audio_format",
                                  f"input_audio_format must be one of {sorted(INPUT_FORMATS)}", event_id=event.event_id)
        if rate not in SUPPORTED_RATES:
            raise p.ProtocolError("unsupported_sample_rate", f"input_sample_rate must be one of "
                                  f"{sorted(SUPPORTED_RATES)}", event_id=event.event_id)
        self._encoder.configure(audio_format, rate)
        self._rates.configure(rate)
        if not self._configured:
            self._configured = self._first_reply_pending = True
        message = {"type": "session.update", "session": translate_session_update(update, self.remote)}
        if event.event_id:
            message["event_id"] = event.event_id
        return message, 0.0

    def _cancel(self, event: p.ResponseCancel) -> list[tuple[dict[str, Any], float]]:
        response_id = event.response_id or self._speaking
        if response_id:
            self._cut.add(response_id)
        if event.reason == "barge_in" and not self._caps.supports_barge_in:
            # The model cannot be interrupted: the edge has gone quiet, the response ends here.
            if response_id and response_id not in self._ended_here:
                self._end_response_here(response_id, "barge_in")
            return []
        if event.reason == "barge_in" and self.remote.extended:
            return [({"type": "barge_in"}, 0.0)]
        message: dict[str, Any] = {"type": "response.cancel"}
        if response_id:
            message["response_id"] = response_id
        if not self.remote.extended:
            message["reason"] = event.reason
        return [(message, 0.0)]

    def _playback_ack(self, event: p.PlaybackAck) -> list[tuple[dict[str, Any], float]]:
        response_id = event.response_id or self._last_response
        if response_id is None:
            return []
        self._drop_unacked(response_id)  # the transport speaks for it: no ack from here
        item_id = event.item_id or self._items.get(response_id)
        if self._caps.supports_playback_ack:
            committed = event.played_ms if event.committed_ms is None else event.committed_ms
            return [(self._ack(response_id, item_id, event.played_ms, committed, event.truncate), 0.0)]
        if self._caps.supports_truncation and item_id:
            return [({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                      "audio_end_ms": event.played_ms}, 0.0)]
        return []

    # ---- acknowledging playback for the transport ----

    def _reply_heard(self, event: p.ResponseAudioDelta) -> None:
        # vLLM-Omni 0.30.0 holds a reply active until it is acknowledged under any policy asked for
        # (its DuplexSessionRunner.start sets ack_only on every session).
        if not self._caps.supports_playback_ack:
            return
        playback = self._unacked.get(event.response_id)
        if playback is None:
            playback = self._unacked[event.response_id] = _Playback(event.item_id, time.monotonic())
            while len(self._unacked) > 64:
                self._drop_unacked(next(iter(self._unacked)))
        playback.received_ms = max(playback.received_ms, event.audio_start_ms + event.audio_ms)

    def _reply_ended(self, response_id: str) -> None:
        """The reply is done: acknowledge it once its audio has had time to play, unless the transport does."""
        playback = self._unacked.get(response_id)
        if playback is None or playback.done:
            return
        playback.done = True
        now = time.monotonic()
        delay = max(0.0, playback.first_at + playback.received_ms / 1000.0 - now) + _SELF_ACK_MARGIN_S
        playback.timer = asyncio.get_running_loop().call_later(delay, self._self_ack_later, response_id)

    def _self_ack_later(self, response_id: str) -> None:
        if self._closing or self._close_reason is not None or response_id not in self._unacked:
            return
        for message, audio_ms in self._self_ack(response_id):
            self._outgoing.put(Outgoing(json.dumps(message, separators=(",", ":")), audio_ms))

    def _self_ack_all(self) -> list[tuple[dict[str, Any], float]]:
        """Acks for every reply the transport left unacknowledged, before its next turn goes out."""
        done = [response_id for response_id, playback in self._unacked.items() if playback.done]
        return [message for response_id in done for message in self._self_ack(response_id)]

    def _self_ack(self, response_id: str) -> list[tuple[dict[str, Any], float]]:
        playback = self._drop_unacked(response_id)
        if playback is None:
            return []
        heard = round(playback.heard_ms(time.monotonic()))
        self._self_acks += 1
        message = self._ack(response_id, playback.item_id, heard, heard, heard < playback.received_ms,
                            event_id=f"{_SELF_ACK}_{self._self_acks}")
        return [(message, 0.0), *self._release_partly_heard(response_id, playback, heard)]

    def _ack(self, response_id: str, item_id: str | None, played_ms: float, committed_ms: float, truncate: bool,
             event_id: str | None = None) -> dict[str, Any]:
        """``playback.ack``, the transport's or our own; a cut reply is always truncated where the server can."""
        message: dict[str, Any] = {"type": "playback.ack", "response_id": response_id, "played_ms": played_ms,
                                   "committed_ms": committed_ms}
        if event_id:
            message["event_id"] = event_id
        if item_id:
            message["item_id"] = item_id
        if (truncate or response_id in self._cut) and self._caps.supports_truncation:
            message["truncate"] = True
        return message

    def _release_partly_heard(self, response_id: str, playback: _Playback,
                              committed_ms: float) -> list[tuple[dict[str, Any], float]]:
        """``output_audio_buffer.clear`` after an ack short of a finished reply's audio, so vLLM-Omni
        frees the turn (see the module docstring). Only for the latest reply: a newer one owns the
        server's playback, and a cut one was freed by its cancel."""
        if (not self.remote.extended or not playback.done
                or committed_ms >= playback.received_ms or response_id in self._cut
                or response_id != self._last_response):
            return []
        self._released.add(response_id)
        self._self_acks += 1
        return [({"type": "output_audio_buffer.clear", "event_id": f"{_SELF_ACK}_{self._self_acks}"}, 0.0)]

    def _drop_unacked(self, response_id: str) -> _Playback | None:
        playback = self._unacked.pop(response_id, None)
        if playback is not None and playback.timer is not None:
            playback.timer.cancel()
        return playback

    async def _write(self) -> None:
        while True:
            await self._connected.wait()
            item = await self._outgoing.get()
            if not self._connected.is_set():
                self._outgoing.put_front(item)  # after what the resume sends again
                continue
            async with self._writing:
                try:
                    await self._send(item)
                except ConnectionError:
                    self._outgoing.put_front(item)  # goes first once the reader has resumed the session
                    self._connected.clear()

    async def _send(self, item: Outgoing) -> None:
        """Write ``item``; on a resumable session with its receipts around it (see ``outbox``)."""
        if not self._resumable:
            await self._ws.send_str(item.text)
            return
        if (before := self._sent.receipt_before(item)) is not None:
            await self._ws.send_str(before.text)
            self._sent.written(before)
        await self._ws.send_str(item.text)
        if (after := self._sent.written(item)) is not None:
            await self._ws.send_str(after.text)
            self._sent.written(after)

    # ---- server -> client ----

    async def _read(self) -> None:
        while True:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                if self._on_text(message.data):
                    return
            elif message.type == aiohttp.WSMsgType.BINARY:
                log.warning("skipping a binary frame from the duplex server")
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                                  aiohttp.WSMsgType.ERROR):
                self._connected.clear()
                if self._close_reason is not None:
                    self._spawn_shutdown(p.SessionClosed(self._close_reason))
                    return
                if self._resumable and await self._resume():
                    continue
                self._emit(p.ErrorEvent.of("backend_disconnected", f"lost the connection to the duplex server "
                                           f"(close code {self._ws.close_code})", error_type="server_error"))
                self._spawn_shutdown(p.SessionClosed("backend_disconnected"))
                return

    def _on_text(self, text: str) -> bool:
        """Handle one server message; True when the session has ended."""
        try:
            data = json.loads(text)
        except ValueError:
            log.warning("skipping a server message that is not JSON")
            return False
        if not isinstance(data, dict):
            log.warning("skipping a server message that is not a JSON object")
            return False
        return self._on_message(data)

    def _on_message(self, data: dict[str, Any]) -> bool:
        """Handle one server event; True when the session has ended."""
        seq = data.get("server_event_seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq <= self._last_seq:
                return False  # already seen (replayed after a resume)
            self._last_seq = seq
            self._ack_events()
        self._last_event_at = time.monotonic()
        kind = data.get("type")
        if kind == "session.resync_required":
            # The server's replay journal overflowed: the session is fine, only a resume could not be complete.
            log.info("session %s: the server cannot replay a resume any more (%s)", self.session_id,
                     data.get("reason"))
            self._resumable = False
            self._sent.clear()
            return False
        error_event_id = str(_error_event_id(data) or "")
        if kind == "session.heartbeat_ack" or error_event_id.startswith((RECEIPT_EVENT_PREFIX, _OPENING_BARRIER)):
            self._sent.received()
        if error_event_id.startswith((RECEIPT_EVENT_PREFIX, _RESUME_PROBE)):
            return False
        if self._opening_echo_window and (kind == "session.heartbeat_ack" or error_event_id == _OPENING_BARRIER):
            self._opening_echo_window = False
            return False
        if self._opening_echo_window and kind == "session.updated":
            return False  # the echo of the opening update
        if error_event_id.startswith(_SELF_ACK):
            log.info("session %s: the server refused an ack sent for the transport: %s", self.session_id,
                     _error_code(data))
            return False
        if kind == "session.closed" and self._close_reason is not None:
            self._spawn_shutdown(p.SessionClosed(self._close_reason))
            return True
        if data.get("type") in _TERMINAL_TYPES:
            ended = f"the duplex server ended the session: {data.get('type')} {data.get('reason', '')}".strip()
            self._emit(p.ErrorEvent.of("backend_disconnected", ended, error_type="server_error"))
            self._spawn_shutdown(p.SessionClosed(str(data.get("reason") or data["type"])))
            return True
        for event in self._reader.read(data):
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
        if isinstance(event, p.OutputAudioBufferCleared) and response_id in self._released:
            return  # the answer to this side's clear: the transport's own playout goes on
        late = isinstance(event, p.ResponseAudioDelta | p.ResponseTranscriptDelta) and response_id in self._cut
        if late or response_id in self._ended_here:
            self.dropped_late_deltas += isinstance(event, p.ResponseAudioDelta)
            return
        if isinstance(event, p.ResponseCreated):
            self._items[event.response_id] = event.item_id
            self._last_response = event.response_id
            if len(self._items) > 256:
                self._items.pop(next(iter(self._items)))
        elif isinstance(event, p.ResponseAudioDelta):
            self._speaking = event.response_id
            self._reply_heard(event)
        elif isinstance(event, p.ResponseDone | p.ResponseAudioDone) and response_id == self._speaking:
            self._speaking = None
        if isinstance(event, p.ResponseDone):
            self._reply_ended(event.response_id)
        self._emit(event)

    def _ack_events(self) -> None:
        """Tell a resumable vLLM-Omni server what arrived, so its replay journal stays short."""
        if not (self.remote.extended and self._caps.supports_resume):
            return
        self._events_unacked += 1
        if self._events_unacked >= self.options.event_ack_every:
            self._events_unacked = 0
            self._outgoing.put(Outgoing(json.dumps({"type": "session.event_ack", "server_event_seq": self._last_seq}),
                                        role=Role.TRANSPORT))

    async def _resume(self) -> bool:
        """Reattach to the session on a new socket; True when the server replays what we missed."""
        backoff = self.options.resume_backoff_s
        # In a pool the first try goes at once: a live host takes it, a dead one refuses it, and either
        # way the caller's gap is shorter (a lone backend waits first, as vLLM-Omni's client does).
        delay = 0.0 if self.options.resume_gives_up_unreachable else backoff
        give_up_at = time.monotonic() + self.options.resume_window_s
        attempt = 0
        while time.monotonic() + delay < give_up_at:
            attempt += 1
            await asyncio.sleep(delay)
            delay = min(backoff if delay == 0 else 2 * delay, 2.0)
            try:
                ws = await self._connect(resume=True)
            except AdmissionError as exc:
                log.info("resume try %d: %s", attempt, exc)
                if self.options.resume_gives_up_unreachable and exc.code in ("backend_unavailable",
                                                                              "backend_timeout"):
                    return False
                continue
            request: dict[str, Any] = {"type": "session.resume", "session_id": self.remote.session_id,
                                       "resume_token": self.remote.resume_token,
                                       "last_received_server_event_seq": self._last_seq}
            if self.remote.incarnation is not None:
                request["incarnation"] = self.remote.incarnation
            try:
                await ws.send_str(json.dumps(request))
                reply = await _first_message(ws, self.options.open_timeout_s)
            except (ConnectionError, TimeoutError):
                reply = None
            kind = reply.get("type") if reply else None
            if reply is not None and kind == "session.resumed":
                token = reply.get("resume_token")
                if isinstance(token, str) and token:
                    self.remote = replace(self.remote, resume_token=token)
                caught_up = await self._catch_up(ws)
                if caught_up is not False:
                    old, self._ws = self._ws, ws
                    await old.close()
                    if caught_up is None:
                        return True  # the session ended in the replay; the shutdown is under way
                    async with self._writing:  # a write still failing on the old socket puts its message back first
                        self._resend_after_resume()
                    self.resumes += 1
                    self._last_event_at = time.monotonic()
                    self._connected.set()
                    log.info("resumed session %s after seq %d", self.session_id, self._last_seq)
                    return True
            await ws.close()
            code = _error_code(reply)
            log.info("resume try %d refused: %s", attempt, code or kind)
            if code in FATAL_RESUME_CODES or kind == "session.resync_required":
                return False
        return False

    async def _catch_up(self, ws: aiohttp.ClientWebSocketResponse) -> bool | None:
        """Send the resume probe and handle the replay up to its answer: True then, None when the
        session ended meanwhile, False when the socket failed or the answer did not come."""
        self._probes += 1
        probe = f"{_RESUME_PROBE}_{self._probes}"
        try:
            await ws.send_str(json.dumps({"type": "conversation.item.retrieve", "event_id": probe, "item_id": probe}))
            while (data := await _first_message(ws, self.options.open_timeout_s)) is not None:
                answered = _error_event_id(data) == probe or (
                    data.get("type") == "conversation.item.retrieved" and (data.get("item") or {}).get("id") == probe)
                if self._on_message(data):
                    return None
                if answered:
                    return True
        except (ConnectionError, TimeoutError) as exc:
            log.info("resume of %s: no answer to the resume probe (%s)", self.session_id, type(exc).__name__)
        return False

    def _resend_after_resume(self) -> None:
        """Put back, in order and ahead of what is queued, what the old socket may not have delivered."""
        dropped = self._sent.dropped_audio_ms
        resend = self._sent.after_resume()
        for item in reversed(resend):
            self._outgoing.put_front(item)
        if resend or self._sent.dropped_audio_ms > dropped:
            log.info("session %s: sending %d message(s) again after the resume; %.0f ms of input audio of "
                     "unknown fate dropped", self.session_id, len(resend), self._sent.dropped_audio_ms - dropped)

    # ---- stalls ----

    async def _watch_stalls(self) -> None:
        limit = self.options.stall_timeout_s
        while True:
            await asyncio.sleep(limit / 4)
            response_id = self._speaking
            silent_s = time.monotonic() - self._last_event_at
            if response_id is None or silent_s <= limit:
                continue
            self._emit(p.ErrorEvent.of(
                "backend_stalled", f"no event from the duplex server for {silent_s:.1f} s while response "
                f"{response_id} played; it is cancelled", error_type="server_error"))
            self._cut.add(response_id)
            self._end_response_here(response_id, "backend_stalled")
            self._outgoing.put(Outgoing(json.dumps({"type": "response.cancel", "response_id": response_id})))

    def _end_response_here(self, response_id: str, reason: str) -> None:
        self._ended_here.add(response_id)
        if self._speaking == response_id:
            self._speaking = None
        self._emit(p.ResponseDone(response_id, "cancelled", reason))

    # ---- lifecycle ----

    def _start(self) -> None:
        name = self.remote.session_id or "remote"
        self._tasks = [asyncio.create_task(self._read(), name=f"remote-read-{name}"),
                       asyncio.create_task(self._write(), name=f"remote-write-{name}"),
                       asyncio.create_task(self._watch_stalls(), name=f"remote-stalls-{name}")]
        if self.remote.extended:
            self._tasks.append(asyncio.create_task(self._heartbeat(), name=f"remote-heartbeat-{name}"))

    async def _heartbeat(self) -> None:
        """``session.heartbeat`` every interval: vLLM-Omni reaps a session whose lease is not refreshed."""
        while True:
            await asyncio.sleep(self.options.heartbeat_interval_s)
            self._outgoing.put(Outgoing('{"type":"session.heartbeat"}', role=Role.RECEIPT))

    def _spawn_shutdown(self, closed: p.SessionClosed) -> None:
        """Shut down from inside the reader: the shutdown runs as its own task, kept in ``_tasks``."""
        if not self._closing:
            self._tasks.append(asyncio.create_task(self._shutdown(closed), name="remote-shutdown"))

    async def _shutdown(self, closed: p.SessionClosed) -> None:
        if self._closing:
            await self._ended.wait()
            return
        self._closing = True
        for response_id in list(self._unacked):
            self._drop_unacked(response_id)
        current = asyncio.current_task()
        others = [task for task in self._tasks if task is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        with contextlib.suppress(TimeoutError):  # a cancelled close drops the connection
            await asyncio.wait_for(self._ws.close(), 2.0)
        self._emit(closed)
        self._events.put_nowait(None)
        self._ended.set()
        if self._on_close is not None:
            self._on_close(self)

    def _emit(self, event: p.ServerEvent) -> None:
        if not self._ended.is_set():
            self._events.put_nowait(event)


def _wire(event: p.ClientEvent) -> dict[str, Any]:
    """A client event as JSON, without the optional fields it leaves unset."""
    return {k: v for k, v in codec.encode_event(event).items() if v is not None}


def _error_event_id(data: dict[str, Any]) -> str | None:
    error = data.get("error") if data.get("type") == "error" else None
    return error.get("event_id") if isinstance(error, dict) else None


def _error_code(data: dict[str, Any] | None) -> str | None:
    if not data or data.get("type") != "error":
        return None
    error = data.get("error")
    return str(error.get("code")) if isinstance(error, dict) else str(data.get("code"))
