"""The websocket to one session on a remote duplex server, kept through dropped connections.

``handshake`` opens the session. ``ServerConnection`` then owns the socket and its tasks:
the writer drains a bounded queue of outgoing messages (with receipts around them on a
resumable session, see ``outbox``), the reader hands each new server message to its owner
(and resumes the session after a dropped connection when the server supports it, replaying
what the old socket may not have delivered), the watcher gives up a host that stopped
answering (``liveness``), and the heartbeat keeps a vLLM-Omni session's lease. It answers for
its own bookkeeping messages (receipts, the opening barrier, the resume probe, event acks) and
passes everything else on.

The socket is opened without aiohttp's own ping handling: its pong deadline is half its ping
interval, too tight to forgive a short pause and too loose to find a frozen host in time, and it
hides the pongs the watcher needs. So the reader answers the server's pings itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.answers import ExpectedAnswers, error_code
from duplex_agent.agent.remote.events import ServerMessageReader
from duplex_agent.agent.remote.input import OutgoingQueue
from duplex_agent.agent.remote.liveness import HostLiveness, Verdict
from duplex_agent.agent.remote.options import RemoteOptions
from duplex_agent.agent.remote.outbox import Outgoing, Role, SentLog
from duplex_agent.agent.remote.session import RemoteSession, parse_session_created
from duplex_agent.agent.session.ports import AdmissionError

log = logging.getLogger("duplex_agent.remote")

Connect = Callable[..., Awaitable[aiohttp.ClientWebSocketResponse]]
#: Resume errors after which trying again cannot help (vLLM-Omni's codes).
FATAL_RESUME_CODES = frozenset({"invalid_session_resume", "session_resume_expired", "unsupported_session_resume",
                                "invalid_resume_token", "session_resume_conflict"})
#: The ``event_id`` of the heartbeat sent right after ``session.created``: every ``session.updated``
#: before its answer is the echo of the opening update, not a reply to the transport's.
_OPENING_BARRIER = "evt_opening_barrier"
#: ``event_id`` (and item id) of the ``conversation.item.retrieve`` sent first on a resumed socket.
#: The server takes it after everything the old socket delivered, and answers it by name
#: (``item_not_found``, both vLLM-Omni and ours): when that answer is in, so are the receipts
#: for the old socket, and the sent log knows what to send again.
_RESUME_PROBE = "evt_resume_probe"
_CLOSED_TYPES = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


async def handshake(connect: Connect, session: dict[str, Any], *, model: str, max_sessions: int,
                    options: RemoteOptions) -> tuple[aiohttp.ClientWebSocketResponse, RemoteSession, int]:
    """Connect, send ``session.update``, wait for ``session.created``: the socket, the session and the
    ``server_event_seq`` of its ``session.created``. AdmissionError when refused."""
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
    return ws, remote, seq if isinstance(seq, int) else 0


async def _first_message(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> dict[str, Any] | None:
    """The next JSON object on ``ws``; None when it closed. Non-JSON text is skipped, pings answered."""
    while True:
        message = await ws.receive(timeout=timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            if message.type in _CLOSED_TYPES:
                return None
            if message.type == aiohttp.WSMsgType.PING:
                await ws.pong(message.data)
            continue
        try:
            data = json.loads(message.data)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data


class LostReason:
    """Why a connection was given up (``on_lost``); the log and ``/metrics`` name it."""

    #: The socket closed or dropped, and the session could not be resumed (or is not resumable).
    CLOSED = "closed"
    #: The socket stayed open but nothing came back, not even a pong (a frozen or cut-off host).
    UNRESPONSIVE = "unresponsive"


class ServerConnection:
    """One session's socket: writer, reader, watcher and heartbeat tasks, and resume with replay.

    ``on_message`` gets every server message that is new (not a replay of one already seen) and
    not an answer to this connection's own bookkeeping; it returns True when the session has
    ended. ``on_lost`` is called, from the reader, when the socket is gone for good (it could not
    be resumed, or ``stop_resuming`` was called), with its close code and a ``LostReason``.
    """

    def __init__(self, connect: Connect, ws: aiohttp.ClientWebSocketResponse, remote: RemoteSession,
                 options: RemoteOptions, answers: ExpectedAnswers, *, last_seq: int,
                 on_message: Callable[[dict[str, Any]], bool],
                 on_lost: Callable[[int | None, str], None]) -> None:
        self._connect = connect
        self._ws = ws
        #: The session as the server last described it (a resume renews its token).
        self.remote = remote
        self.options = options
        self._answers = answers
        self._on_message = on_message
        self._on_lost = on_lost
        self._outgoing = OutgoingQueue(options.max_queued_input_ms)
        self._connected = asyncio.Event()
        self._connected.set()
        self._last_seq = last_seq
        self._events_unacked = 0
        #: When the server last sent something new (``time.monotonic``).
        self.last_event_at = time.monotonic()
        self.liveness = HostLiveness(probe_after_s=options.probe_after_s,
                                     unresponsive_after_s=options.unresponsive_after_s, clock=time.monotonic)
        self._unresponsive = False  # the watcher gave the host up; the reader ends the socket
        self._probe: asyncio.Task[None] | None = None
        self._opening_echo_window = False  # until the opening barrier's answer
        self._resumable = remote.capabilities.supports_resume and bool(remote.resume_token)
        self._resuming_stopped = False
        self._sent = SentLog(options.receipt_every_ms, answers)  # only while resumable
        self._probes = 0
        self._writing = asyncio.Lock()  # held while a message is written: a resume swaps sockets between writes
        self._tasks: list[asyncio.Task[None]] = []
        #: Times the session was resumed on a new socket.
        self.resumes = 0
        if remote.extended:
            self._send_opening_barrier()

    @property
    def queued_audio_ms(self) -> float:
        return self._outgoing.audio_ms

    @property
    def resume_dropped_input_ms(self) -> float:
        return self._sent.dropped_audio_ms

    @property
    def resent_after_resume(self) -> int:
        return self._sent.resent

    @property
    def socket_open(self) -> bool:
        return not self._ws.closed

    def start(self) -> None:
        name = self.remote.session_id or "remote"
        self._tasks = [asyncio.create_task(self._read(), name=f"remote-read-{name}"),
                       asyncio.create_task(self._write(), name=f"remote-write-{name}"),
                       asyncio.create_task(self._watch_host(), name=f"remote-watch-{name}")]
        if self.remote.extended:
            self._tasks.append(asyncio.create_task(self._heartbeat(), name=f"remote-heartbeat-{name}"))

    def put(self, message: dict[str, Any], audio_ms: float = 0.0, role: Role | None = None) -> bool:
        """Queue ``message`` for the socket; True when this starts dropping the oldest queued input audio."""
        return self._outgoing.put(Outgoing(json.dumps(message, separators=(",", ":")), audio_ms, role))

    def stop_resuming(self) -> None:
        """This side is ending the session: a socket that drops from now on is not resumed."""
        self._resuming_stopped = True

    async def close(self) -> None:
        """Cancel and await the tasks (all but the calling one), then close the socket."""
        current = asyncio.current_task()
        tasks = [task for task in [*self._tasks, self._probe] if task is not None and task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):  # a cancelled close drops the connection
            await asyncio.wait_for(self._ws.close(), 2.0)

    # ---- writing ----

    def _send_opening_barrier(self) -> None:
        self._opening_echo_window = True
        self._answers.expect(_OPENING_BARRIER, self._opening_barrier_refused)
        self.put({"type": "session.heartbeat", "event_id": _OPENING_BARRIER}, role=Role.RECEIPT)

    async def _heartbeat(self) -> None:
        """``session.heartbeat`` every interval: vLLM-Omni reaps a session whose lease is not refreshed."""
        while True:
            await asyncio.sleep(self.options.heartbeat_interval_s)
            self.put({"type": "session.heartbeat"}, role=Role.RECEIPT)

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

    # ---- reading ----

    async def _read(self) -> None:
        while True:
            message = await self._ws.receive()
            self.liveness.heard()
            if message.type == aiohttp.WSMsgType.TEXT:
                if self._on_text(message.data):
                    return
            elif message.type == aiohttp.WSMsgType.PING:
                with contextlib.suppress(ConnectionError):
                    await self._ws.pong(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                log.warning("skipping a binary frame from the duplex server")
            elif message.type in _CLOSED_TYPES:
                self._connected.clear()
                # A host that stopped answering on an open socket would not answer a new one either:
                # in a pool the call moves on at once (a lone backend keeps trying, it may come back).
                gone = self._unresponsive and self.options.resume_gives_up_unreachable
                if not self._resuming_stopped and self._resumable and not gone and await self._resume():
                    continue
                self._on_lost(self._ws.close_code,
                              LostReason.UNRESPONSIVE if self._unresponsive else LostReason.CLOSED)
                return

    # ---- watching the host ----

    async def _watch_host(self) -> None:
        """Probe a quiet socket; end one whose host answers nothing for ``unresponsive_after_s``."""
        while True:
            if not self._connected.is_set():  # a resume is under way, with timeouts of its own
                await self._connected.wait()
                self.liveness.heard()
            await asyncio.sleep(self.liveness.next_check_in())
            if not self._connected.is_set():
                continue
            verdict = self.liveness.verdict()
            if verdict is Verdict.PROBE and (self._probe is None or self._probe.done()):
                # Its own task: with the server not reading, the ping's write may wait on a full buffer.
                self._probe = asyncio.create_task(self._ping(self._ws), name="remote-probe")
            elif verdict is Verdict.UNRESPONSIVE:
                # What arrived while this loop was busy is read first: a stalled loop is not a silent host.
                for _ in range(3):
                    await asyncio.sleep(0)
                if self._connected.is_set() and self.liveness.verdict() is Verdict.UNRESPONSIVE:
                    self._give_up_host()

    @staticmethod
    async def _ping(ws: aiohttp.ClientWebSocketResponse) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.ping()

    def _give_up_host(self) -> None:
        """Nothing from the server, not even a pong: end the socket here, as a reset would have."""
        self._unresponsive = True
        log.warning("session %s: the duplex server answered nothing for %.1f s, not even a ping; giving the "
                    "connection up", self.remote.session_id, self.liveness.silent_s)
        self._connected.clear()
        # The socket's own shutdown: the reader sees the end at once, and a writer waiting on the
        # frozen peer's full buffer fails instead of waiting for the kernel's retransmission timeout.
        sock = self._ws.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

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
        return self._receive(data)

    def _receive(self, data: dict[str, Any]) -> bool:
        """Handle one server message; True when the session has ended."""
        seq = data.get("server_event_seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq <= self._last_seq:
                return False  # already seen (replayed after a resume)
            self._last_seq = seq
            self._ack_events()
        self.last_event_at = time.monotonic()
        kind = data.get("type")
        if kind == "session.resync_required":
            # The server's replay journal overflowed: the session is fine, only a resume could not be complete.
            log.info("session %s: the server cannot replay a resume any more (%s)", self.remote.session_id,
                     data.get("reason"))
            self._resumable = False
            self._sent.clear()
            return False
        if kind == "session.heartbeat_ack":
            # Heartbeats are answered in the order they went out, and name none: this is the oldest's.
            self._sent.received()
            if self._opening_echo_window:
                self._opening_echo_window = False
                self._answers.forget(_OPENING_BARRIER)
                return False
        elif self._answers.take(data):
            return False
        if self._opening_echo_window and kind == "session.updated":
            return False  # the echo of the opening update
        return self._on_message(data)

    def _opening_barrier_refused(self, error: dict[str, Any]) -> bool:
        """An ``error`` answering the opening barrier answers it all the same (and is a receipt)."""
        self._sent.received()
        self._opening_echo_window = False
        return True

    def _ack_events(self) -> None:
        """Tell a resumable vLLM-Omni server what arrived, so its replay journal stays short."""
        if not (self.remote.extended and self.remote.capabilities.supports_resume):
            return
        self._events_unacked += 1
        if self._events_unacked >= self.options.event_ack_every:
            self._events_unacked = 0
            self.put({"type": "session.event_ack", "server_event_seq": self._last_seq}, role=Role.TRANSPORT)

    # ---- resuming ----

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
                    self.last_event_at = time.monotonic()
                    self._unresponsive = False
                    self._connected.set()
                    log.info("resumed session %s after seq %d", self.remote.session_id, self._last_seq)
                    return True
            await ws.close()
            code = error_code(reply)
            log.info("resume try %d refused: %s", attempt, code or kind)
            if code in FATAL_RESUME_CODES or kind == "session.resync_required":
                return False
        return False

    async def _catch_up(self, ws: aiohttp.ClientWebSocketResponse) -> bool | None:
        """Send the resume probe and handle the replay up to its answer: True then, None when the
        session ended meanwhile, False when the socket failed or the answer did not come."""
        self._probes += 1
        probe = f"{_RESUME_PROBE}_{self._probes}"
        answered = False

        def on_answer(answer: dict[str, Any]) -> bool:
            nonlocal answered
            answered = True
            return answer.get("type") == "error"  # a retrieved item (none is expected) goes on as any other

        self._answers.expect(probe, on_answer)
        try:
            await ws.send_str(json.dumps({"type": "conversation.item.retrieve", "event_id": probe, "item_id": probe}))
            while (data := await _first_message(ws, self.options.open_timeout_s)) is not None:
                if self._receive(data):
                    return None
                if answered:
                    return True
        except (ConnectionError, TimeoutError) as exc:
            log.info("resume of %s: no answer to the resume probe (%s)", self.remote.session_id, type(exc).__name__)
        return False

    def _resend_after_resume(self) -> None:
        """Put back, in order and ahead of what is queued, what the old socket may not have delivered."""
        dropped = self._sent.dropped_audio_ms
        resend = self._sent.after_resume()
        for item in reversed(resend):
            self._outgoing.put_front(item)
        if resend or self._sent.dropped_audio_ms > dropped:
            log.info("session %s: sending %d message(s) again after the resume; %.0f ms of input audio of "
                     "unknown fate dropped", self.remote.session_id, len(resend), self._sent.dropped_audio_ms - dropped)
