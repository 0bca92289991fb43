"""A stand-in vLLM-Omni duplex server that checks what it receives the way vLLM-Omni does.

Written from vLLM-Omni's code (``translate_realtime_command``, ``validate_realtime_turn_detection``,
``decode_audio_append``, the websocket handler's envelope events and resume): every client
event it does not know gets ``unknown_event``, a bad session object gets
``unsupported_turn_detection`` / ``unsupported_audio_format``, a bad append ``bad_event`` /
``bad_audio``. Every error it sends is recorded in ``errors``, so a test can require none.

Its model is model-native: after ``reply_after_ms`` of appended audio it answers with a
response of ``reply_chunks`` 100 ms pcm16 deltas at 24 kHz (each with ``audio_text_marks`` and
its transcript delta), or with text only (``text_only``: ``response.output_text.delta/done``);
barge-in cancels it, and ``playback.ack`` is acknowledged. As in vLLM-Omni 0.30.0, a bare
``input_audio_buffer.commit`` starts no response (``response_create`` defaults to false;
``input.commit`` to true), and under ``playback_commit_policy`` ``ack_only`` a reply stays
active until its playback is acknowledged: ``response.create`` meanwhile is
``response_already_active``, and new speech only yields ``overlap.decision``. Sessions are
resumable from a replay journal; ``overflow()`` makes the journal overflow as vLLM-Omni's does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import secrets
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

CAPS = {"implementation_level": "model_native_duplex", "supports_input_append": True, "supports_barge_in": True,
        "supports_session_resume": True, "supports_audio_truncate": True, "chunk_period_ms": 1000,
        "input_modes": ["append_audio_chunk"]}
INPUT_FORMATS = {"pcm16", "pcm_s16le", "s16le", "pcm_f32le", "g711_ulaw", "g711_alaw"}
#: Client event types (and aliases) ``translate_realtime_command`` and the envelope accept.
CLIENT_EVENTS = {
    "session.update", "conversation.item.create", "conversation.item.delete", "conversation.item.truncate",
    "input_audio_buffer.append", "input_audio_buffer.commit", "input.commit", "input_audio_buffer.clear",
    "output_audio_buffer.clear", "response.cancel", "response.create", "playback.ack", "audio.playback_ack",
    "session.heartbeat", "conversation.item.retrieve", "session.close", "close", "close_session",
    "input.text.append", "input_text.append", "push_text", "input.cancel", "barge_in", "turn.signal", "signal_turn",
    "session.event_ack", "session.resume",
}
RATE = 24000
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again"]


def turn_detection_problem(session: dict[str, Any]) -> str | None:
    """vLLM-Omni's pairing rules for ``turn_detection`` and ``overlap_policy``."""
    present = "turn_detection" in session
    detection = session.get("turn_detection")
    audio = session.get("audio")
    if isinstance(audio, dict) and isinstance(audio.get("input"), dict) and "turn_detection" in audio["input"]:
        present, detection = True, audio["input"]["turn_detection"]
    policy = session.get("overlap_policy")
    if not present:
        return "barge_in_on_speech requires server_vad" if policy == "barge_in_on_speech" else None
    if detection is not None and not isinstance(detection, dict):
        return "turn_detection must be null or an object"
    if isinstance(detection, dict):
        if detection.get("type") != "server_vad":
            return "turn_detection.type must be 'server_vad'"
        threshold = detection.get("threshold", 0.5)
        if not isinstance(threshold, int | float) or not 0 < threshold <= 1:
            return "bad threshold"
        for name in ("prefix_padding_ms", "silence_duration_ms", "min_speech_duration_ms"):
            value = detection.get(name)
            if value is not None and (not isinstance(value, int | float) or value < 0):
                return f"bad {name}"
        if detection.get("interrupt_response", True) is not True:
            return "interrupt_response=false is unsupported"
    wanted = "barge_in_on_speech" if detection is not None else "listen_only"
    if isinstance(policy, str) and policy != wanted:
        return f"overlap_policy={policy!r} conflicts with turn_detection; expected {wanted!r}"
    return None


class OmniSession:
    """One session; outlives its socket for resume."""

    def __init__(self, fake: FakeOmni) -> None:
        self.fake = fake
        self.id = f"duplex-{secrets.token_hex(6)}"
        self.token = secrets.token_urlsafe(16)
        self.seq = 0
        self.journal: list[dict[str, Any]] | None = []  # None once overflowed
        self.ws: web.WebSocketResponse | None = None
        self.request: web.Request | None = None
        self.heard_ms = 0.0
        self.response: asyncio.Task[None] | None = None
        self.responses = 0
        self.played: dict[str, float] = {}
        self.ack_only = False
        self.unacked: str | None = None  # a finished reply whose playback is not acknowledged (ack_only)
        self.items = 0

    @property
    def active(self) -> bool:
        return self.response is not None or (self.ack_only and self.unacked is not None)

    def configure(self, session: dict[str, Any]) -> None:
        policy = session.get("playback_commit_policy")
        if isinstance(policy, str):  # vLLM-Omni normalizes an unknown policy to commit_all_on_done
            self.ack_only = policy.strip().lower() == "ack_only"

    def start_reply(self) -> None:
        self.response = asyncio.create_task(self.speak())

    async def send(self, event: dict[str, Any], *, journal: bool = True) -> None:
        if journal and self.journal is not None:
            self.seq += 1
            event = {**event, "server_event_seq": self.seq}
            self.journal.append(event)
        if event.get("type") == "error":
            self.fake.errors.append(event)
        if self.ws is not None and not self.ws.closed:
            with contextlib.suppress(ConnectionError):
                await self.ws.send_str(json.dumps(event))

    async def error(self, code: str, message: str, event_id: Any = None) -> None:
        await self.send({"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                                    "message": message, "event_id": event_id}})

    async def speak(self) -> None:
        self.responses += 1
        response_id = f"resp_{self.responses}"
        await self.send({"type": "response.created", "response_id": response_id,
                         "response": {"id": response_id, "object": "realtime.response", "status": "in_progress",
                                      "status_details": None, "output": []}})
        await self.send({"type": "response.speak", "response_id": response_id, "item_id": f"item_{response_id}",
                         "output_index": 0, "content_index": 0})
        if self.fake.text_only:
            await self.say_text(response_id)
            return
        spoken = ""
        for n in range(self.fake.reply_chunks):
            word = WORDS[n % len(WORDS)]
            text = (" " if spoken else "") + word
            spoken += text
            samples = (0.2 * np.sin(np.arange(RATE // 10) / 4) * 32767).astype("<i2")
            common = {"response_id": response_id, "item_id": f"item_{response_id}", "output_index": 0,
                      "content_index": 0}
            await self.send({"type": "response.output_audio.delta", **common,
                             "delta": base64.b64encode(samples.tobytes()).decode(), "format": "pcm16",
                             "sample_rate_hz": RATE,
                             "metadata": {"session_id": self.id, "epoch": 0, "audio_duration_ms": 100 * (n + 1),
                                          "audio_text_marks": [{"text_chars": len(spoken),
                                                                "audio_end_ms": 100 * (n + 1)}]}})
            await self.send({"type": "response.output_audio_transcript.delta", **common, "delta": text})
            await asyncio.sleep(self.fake.chunk_pause_s)
        await self.send({"type": "response.output_audio.done", "response_id": response_id,
                         "item_id": f"item_{response_id}", "output_index": 0, "content_index": 0})
        await self.finish(response_id)

    async def say_text(self, response_id: str) -> None:
        """A text-only reply, as 0.30.0's projection sends ``response.text.delta`` (``TextDelta`` / ``TextDone``)."""
        common = {"response_id": response_id, "item_id": f"item_{response_id}", "output_index": 0,
                  "content_index": 0}
        words = WORDS[:self.fake.reply_chunks]
        for n, word in enumerate(words):
            await self.send({"type": "response.output_text.delta", **common, "delta": (" " if n else "") + word})
            await asyncio.sleep(self.fake.chunk_pause_s)
        await self.send({"type": "response.output_text.done", **common, "text": " ".join(words)})
        await self.finish(response_id, audio=False)

    async def finish(self, response_id: str, *, audio: bool = True) -> None:
        await self.send({"type": "response.done", "response_id": response_id,
                         "response": {"id": response_id, "object": "realtime.response", "status": "completed",
                                      "status_details": {"type": "completed", "reason": "stop"}, "output": []}})
        self.unacked = response_id if audio else None
        self.response = None

    async def commit(self, data: dict[str, Any]) -> None:
        create = data.get("response_create", data.get("create_response", data.get("type") == "input.commit"))
        self.items += 1
        item_id = f"item_user_{self.items}"
        await self.send({"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": item_id,
                         "event": {"type": "input.committed", "session_id": self.id, "realtime_item_id": item_id}})
        self.heard_ms = 0.0
        if create is True and not self.active:
            self.start_reply()

    async def cancel(self, reason: str) -> None:
        task, self.response = self.response, None
        self.unacked = None  # a cancel settles the reply's playback
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        response_id = f"resp_{self.responses}"
        await self.send({"type": "output_audio_buffer.cleared", "response_id": response_id})
        await self.send({"type": "response.done", "response_id": response_id,
                         "response": {"id": response_id, "object": "realtime.response", "status": "cancelled",
                                      "status_details": {"type": "cancelled", "reason": reason}, "output": []}})

    async def handle(self, data: dict[str, Any]) -> bool:
        """One client event; True when the session is closed."""
        kind, event_id = data.get("type"), data.get("event_id")
        self.fake.received.append(data)
        if kind not in CLIENT_EVENTS:
            await self.error("unknown_event", f"Unknown duplex event type: {kind}", event_id)
        elif kind == "session.update":
            session = data.get("session") if isinstance(data.get("session"), dict) else data
            problem = turn_detection_problem(session)
            if problem:
                await self.error("unsupported_turn_detection", problem, event_id)
            else:
                self.fake.updates.append(session)
                self.configure(session)
                await self.send({"type": "session.updated", "session": {"id": self.id, **session}})
        elif kind == "input_audio_buffer.append":
            fmt = data.get("format", "pcm16")
            if fmt not in INPUT_FORMATS:
                await self.error("unsupported_audio_format", f"Unsupported input_audio_format: {fmt}", event_id)
                return False
            try:
                raw = base64.b64decode(str(data.get("audio", "")), validate=True)
            except (binascii.Error, ValueError):
                await self.error("bad_audio", "input audio is not valid base64", event_id)
                return False
            width = 4 if fmt == "pcm_f32le" else 1 if fmt.startswith("g711") else 2
            rate = data.get("sample_rate_hz", 16000)
            self.heard_ms += 1000.0 * len(raw) / width / rate
            if self.heard_ms >= self.fake.reply_after_ms:
                self.heard_ms = 0.0
                if not self.active:
                    self.start_reply()
                else:
                    await self.send({"type": "overlap.decision", "session_id": self.id, "epoch": 0,
                                     "policy": "listen_only", "action": "ignore", "reason": "assistant_active",
                                     "metadata": {}})
        elif kind in ("input_audio_buffer.commit", "input.commit"):
            await self.commit(data)
        elif kind == "response.create":
            if self.active:
                await self.error("response_already_active",
                                 "response.create cannot start while another response is active.", event_id)
            else:
                self.start_reply()
        elif kind == "session.heartbeat":
            self.fake.heartbeats += 1
            await self.send({"type": "session.heartbeat_ack", "session_id": self.id})
        elif kind == "conversation.item.retrieve":  # the fake keeps no items: every one is unknown
            await self.error("item_not_found", f"no item {data.get('item_id')!r}", event_id)
        elif kind == "session.event_ack":
            if not isinstance(data.get("server_event_seq"), int) or data["server_event_seq"] > self.seq:
                await self.error("invalid_event_ack", "bad server_event_seq", event_id)
            elif self.journal is not None:
                self.journal = [e for e in self.journal if e["server_event_seq"] > data["server_event_seq"]]
        elif kind in ("barge_in", "response.cancel"):
            await self.cancel("barge_in" if kind == "barge_in" else "client_cancelled")
        elif kind in ("playback.ack", "audio.playback_ack"):
            if not isinstance(data.get("played_ms"), int | float):
                await self.error("bad_event", "playback.ack requires numeric played_ms", event_id)
                return False
            self.played[str(data.get("response_id"))] = float(data["played_ms"])
            if data.get("response_id") in (None, self.unacked):
                self.unacked = None
            await self.send({"type": "playback.acknowledged", "event": {
                "type": "playback.acknowledged", "session_id": self.id, "played_ms": data["played_ms"]}})
        elif kind in ("session.close", "close", "close_session"):
            await self.cancel("client_close")
            await self.send({"type": "session.closed", "session_id": self.id, "reason": "client_close"})
            return True
        elif kind == "session.resume":
            await self.error("unsupported_session_resume", "session.resume must be the first message", event_id)
        return False


class FakeOmni:
    def __init__(self, *, reply_after_ms: float = 600.0, reply_chunks: int = 10, chunk_pause_s: float = 0.02,
                 text_only: bool = False) -> None:
        self.reply_after_ms = reply_after_ms
        self.text_only = text_only
        self.reply_chunks = reply_chunks
        self.chunk_pause_s = chunk_pause_s
        self.sessions: dict[str, OmniSession] = {}
        self.errors: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.resumes = 0
        app = web.Application()
        app.router.add_get("/v1/realtime", self._handle)
        self._server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self._server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)

    async def start(self) -> FakeOmni:
        await self._server.start_server()
        return self

    async def close(self) -> None:
        for session in self.sessions.values():
            if session.response is not None:
                session.response.cancel()
        await self._server.close()

    def live(self) -> OmniSession:
        """The one session that is not closed."""
        [session] = [s for s in self.sessions.values() if s.ws is not None and not s.ws.closed]
        return session

    def drop(self) -> None:
        """Cut the live session's connection without a close frame."""
        session = self.live()
        assert session.request is not None and session.request.transport is not None
        session.request.transport.abort()

    async def overflow(self) -> None:
        """The journal outgrows its bound: say so once (unjournaled), as vLLM-Omni does, and keep serving."""
        session = self.live()
        session.journal = None
        await session.send({"type": "session.resync_required", "session_id": session.id,
                            "reason": "journal_overflow"}, journal=False)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=15 << 20)
        await ws.prepare(request)
        first = await ws.receive(timeout=10)
        data = json.loads(first.data) if first.type == WSMsgType.TEXT else {}
        session = await (self._resume(ws, data) if data.get("type") == "session.resume" else self._open(ws, data))
        if session is None:
            await ws.close()
            return ws
        session.ws, session.request = ws, request
        try:
            async for message in ws:
                if message.type == WSMsgType.TEXT and await session.handle(json.loads(message.data)):
                    break
        finally:
            if session.ws is ws:
                session.ws = None
        await ws.close()
        return ws

    async def _open(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> OmniSession | None:
        session = OmniSession(self)
        session.ws = ws
        if data.get("type") != "session.update":
            await session.error("bad_event", "expected session.update")
            return None
        payload = data.get("session") if isinstance(data.get("session"), dict) else data
        problem = turn_detection_problem(payload)
        if problem:
            await session.error("unsupported_turn_detection", problem, data.get("event_id"))
            return None
        self.updates.append(payload)
        session.configure(payload)
        self.sessions[session.id] = session
        await session.send({"type": "session.created", "attachment_generation": 1, "resume_token": session.token,
                            "session": {"object": "realtime.session", "id": session.id,
                                        "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                                        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}},
                                                  "output": {"format": {"type": "audio/pcm", "rate": RATE}}},
                                        "capabilities": CAPS}}, journal=False)
        await session.send({"type": "session.updated", "session": {"id": session.id, **payload}})
        return session

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> OmniSession | None:
        session = self.sessions.get(str(data.get("session_id")))
        fail = OmniSession(self)
        fail.ws = ws
        if session is None:
            await fail.error("session_resume_expired", "Unknown or expired duplex session")
            return None
        if data.get("resume_token") != session.token:
            await fail.error("invalid_resume_token", "Invalid duplex session resume token")
            return None
        if session.journal is None:
            await ws.send_str(json.dumps({"type": "session.resync_required", "session_id": session.id,
                                          "reason": "journal_gap"}))
            return None
        self.resumes += 1
        session.token = secrets.token_urlsafe(16)
        await ws.send_str(json.dumps({"type": "session.resumed", "session_id": session.id, "resume_token":
                                      session.token, "attachment_generation": 1 + self.resumes,
                                      "session": {"id": session.id}}))
        last = data.get("last_received_server_event_seq", 0)
        for event in session.journal:
            if event["server_event_seq"] > last:
                await ws.send_str(json.dumps(event))
        return session
