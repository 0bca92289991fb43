"""HTTP signaling for direct browser peers: ``POST``/``PATCH /api/offer``.

POST takes ``{"sdp", "type": "offer", "pc_id"?, "resumable"?, "resume"?}`` and
answers ``{"sdp", "type": "answer", "pc_id", "resume_token"?}``; a known ``pc_id``
renegotiates that peer, ``resume: {"pc_id", "resume_token"}`` reattaches a
dropped resumable peer's conversation (see ``resume``). PATCH takes ``{"pc_id", "candidates": [{"candidate", "sdp_mid",
"sdp_mline_index"}]}`` for clients that trickle ICE; DELETE ``{"pc_id"}`` hangs up. Bad requests get a 4xx
with ``{"error": {"code", "message"}}``; a full worker, or one whose machine is saturated
(``--max-cpu``), gets 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription, candidate_from_sdp

from duplex_agent.agent.metrics import SESSIONS_REFUSED, SESSIONS_TOTAL
from duplex_agent.agent.protocol.request_body import BodyTooLarge, read_whole_body
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.ports import AdmissionError, Conversation, DuplexBackend
from duplex_agent.webrtc.direct.answer_sdp import ask_for_opus_fec
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.ice_consent import ConsentHookUnavailable
from duplex_agent.webrtc.direct.peer_session import HUNG_UP, MEDIA_TIMEOUT, TRANSPORT, PeerSession
from duplex_agent.webrtc.direct.resume import ParkedConversations, ResumeRefused

logger = logging.getLogger("duplex_agent.webrtc")

MAX_BODY_BYTES = 64 * 1024
MAX_CANDIDATES = 64
#: Retry-After for a full worker: a slot frees when a call ends, on the callers' clock.
FULL_RETRY_AFTER_S = 10
#: Ways a peer ends that end the conversation too; after any other, a resumable one is parked.
_NOT_PARKED = ("conversation_closed", "shutdown", "bad_offer", "start_failed", "client_close", MEDIA_TIMEOUT,
               HUNG_UP)


#: A live peer whose page resumed on a new connection: ended, its conversation parked for that one.
RESUMED_ELSEWHERE = "resumed_on_new_connection"


class SignalingError(Exception):
    def __init__(self, status: int, code: str, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return web.json_response({"error": {"code": self.code, "message": str(self)}}, status=self.status,
                                 headers=headers)


def refused(exc: AdmissionError) -> SignalingError:
    """A new call the worker cannot take now: 503, with how long to wait where that is known."""
    retry_after_s = exc.retry_after_s
    if retry_after_s is None and exc.code == "resource_exhausted":
        retry_after_s = FULL_RETRY_AFTER_S
    return SignalingError(503, exc.code, str(exc), retry_after_s=retry_after_s)


class PeerRegistry:
    """The live peer sessions of one app, and the tasks closing them."""

    def __init__(self, backend: DuplexBackend, host_address: str, audio_options: dict[str, Any],
                 resume_grace_s: float = 30.0, cpu_guard: CpuGuard | None = None) -> None:
        self.backend = backend
        self.cpu_guard = cpu_guard
        self.host_address = host_address
        self.audio_options = audio_options
        self.sessions: dict[str, PeerSession] = {}
        self.parked = ParkedConversations(resume_grace_s)
        #: Peers being closed now (their closing task by pc_id), and those of them the page hung up
        #: on meanwhile (not to be parked).
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._hung_up: set[str] = set()

    async def open(self, conversation: Conversation | None = None) -> PeerSession:
        """A peer for a new conversation, or for ``conversation`` (a resumed one)."""
        if conversation is None:  # a new call; a resumed one was admitted before
            try:
                if self.cpu_guard is not None:
                    self.cpu_guard.check()
                conversation = await self.backend.open()
            except AdmissionError as exc:
                SESSIONS_REFUSED.labels(TRANSPORT, exc.code).inc()
                raise refused(exc) from None
        pc_id = uuid.uuid4().hex
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no STUN traffic
        session = PeerSession(pc_id, pc, conversation, on_finished=self.finish, **self.audio_options)
        self.sessions[pc_id] = session
        SESSIONS_TOTAL.labels(transport=TRANSPORT).inc()
        try:
            await session.start()
        except BaseException:
            self.sessions.pop(pc_id, None)
            await session.close("start_failed")
            raise
        return session

    def finish(self, session: PeerSession, reason: str) -> None:
        """Close ``session`` for ``reason``; it leaves ``sessions`` at once, so a second ending finds it closing."""
        if self.sessions.get(session.pc_id) is not session:
            return
        pc_id = session.pc_id
        del self.sessions[pc_id]
        task = asyncio.create_task(self._close(session, reason), name=f"peer-{pc_id}-close")
        self._closing[pc_id] = task
        task.add_done_callback(lambda _task: self._closing.pop(pc_id, None))

    async def _close(self, session: PeerSession, reason: str) -> None:
        park = self.parked.is_resumable(session.pc_id) and reason not in _NOT_PARKED
        if not park:
            self.parked.forget(session.pc_id)
        try:
            await session.close(reason, keep_conversation=park)
        except Exception:
            logger.exception("closing peer %s failed", session.pc_id)
        if park and session.pc_id in self._hung_up:  # the page's hang-up came while its peer was closing
            self.parked.forget(session.pc_id)
            await session.conversation.close("client_close")
        elif park:
            self.parked.park(session.pc_id, session.conversation)
        self._hung_up.discard(session.pc_id)

    async def claim(self, pc_id: str, token: str) -> Conversation:
        """The parked conversation of ``pc_id``; a peer still closing is waited for, so it is parked by then.

        A page often comes back before this side has noticed its connection go: a path that went
        silent takes ICE seconds to give up on, a closed one a moment to be seen. With the right
        token, the resume itself says the old connection is dead: that peer is ended and parked,
        and the conversation moves over. A wrong token leaves the live call alone."""
        live = self.sessions.get(pc_id)
        if live is not None:
            if not self.parked.token_matches(pc_id, token):
                raise ResumeRefused(403, "invalid_resume_token", "invalid resume token")
            self.finish(live, RESUMED_ELSEWHERE)
        closing = self._closing.get(pc_id)
        if closing is not None:
            await asyncio.shield(closing)  # the request going away must not cut the close short
        return self.parked.claim(pc_id, token)

    async def hang_up(self, pc_id: str) -> bool:
        """The page ended its call on purpose: no resume; False when no such peer is known."""
        if pc_id in self.sessions:
            self.finish(self.sessions[pc_id], "client_close")
            return True
        if pc_id in self._closing:
            self._hung_up.add(pc_id)
            return True
        return await self.parked.discard(pc_id, "client_close")

    async def close_all(self, _app: web.Application | None = None) -> None:
        for session in list(self.sessions.values()):
            self.finish(session, "shutdown")
        if self._closing:
            await asyncio.gather(*self._closing.values(), return_exceptions=True)
        await self.parked.close_all()


WEBRTC_PEERS = web.AppKey("webrtc_peers", PeerRegistry)


# ---- request parsing ----


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await read_whole_body(request, MAX_BODY_BYTES)
    except BodyTooLarge as exc:
        raise SignalingError(exc.status, exc.code, str(exc)) from None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SignalingError(400, "invalid_json", "body is not JSON") from None
    if not isinstance(data, dict):
        raise SignalingError(400, "invalid_json", "body must be a JSON object")
    return data


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    value = data.get(name)
    if value is None and not required:
        return None
    if value is None:
        raise SignalingError(400, "missing_field", f"missing field {name!r}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SignalingError(400, "invalid_field", f"field {name!r} has the wrong type")
    return value


def _check_offer_sdp(sdp: str) -> None:
    """Reject what is not an SDP offer with an audio section before any work is done."""
    if not sdp.startswith("v=0"):
        raise SignalingError(400, "malformed_sdp", "SDP must start with 'v=0'")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # the parser raises assorted errors on bad input
        raise SignalingError(400, "malformed_sdp", f"SDP does not parse: {exc!r}") from None
    if not parsed.media:
        raise SignalingError(400, "malformed_sdp", "SDP has no media sections")
    if not any(media.kind == "audio" for media in parsed.media):
        raise SignalingError(400, "no_audio", "the offer has no audio section")


def _session(request: web.Request, pc_id: str) -> PeerSession:
    session = request.app[WEBRTC_PEERS].sessions.get(pc_id)
    if session is None:
        raise SignalingError(404, "unknown_pc_id", f"no peer connection {pc_id!r}")
    return session


# ---- handlers ----


async def _answer(registry: PeerRegistry, session: PeerSession, sdp: str, *, new: bool,
                  resumable: bool = False) -> web.Response:
    pc = session.pc
    try:
        with candidates_on(registry.host_address):
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            session.watch_transport()
            await pc.setLocalDescription(await pc.createAnswer())
    except ConsentHookUnavailable:  # our fault, not the offer's
        if new:
            registry.finish(session, "start_failed")
        raise
    except Exception as exc:  # aiortc rejects bad offers with assorted exception types
        if new:
            registry.finish(session, "bad_offer")
        raise SignalingError(400, "malformed_sdp", f"offer rejected: {exc!r}") from None
    local = pc.localDescription
    answer = {"sdp": ask_for_opus_fec(local.sdp), "type": local.type, "pc_id": session.pc_id}
    if resumable:
        answer["resume_token"] = registry.parked.issue(session.pc_id)
    return web.json_response(answer)


async def post_offer(request: web.Request) -> web.Response:
    registry = request.app[WEBRTC_PEERS]
    try:
        data = await _read_json(request)
        sdp = _field(data, "sdp", str)
        if _field(data, "type", str) != "offer":
            raise SignalingError(400, "invalid_field", "type must be 'offer'")
        pc_id = _field(data, "pc_id", str, required=False)
        resume = _field(data, "resume", dict, required=False)
        resumable = data.get("resumable") is True or resume is not None
        _check_offer_sdp(sdp)
        if pc_id is not None:
            return await _answer(registry, _session(request, pc_id), sdp, new=False, resumable=resumable)
        conversation = None
        if resume is not None:
            try:
                conversation = await registry.claim(_field(resume, "pc_id", str), _field(resume, "resume_token", str))
            except ResumeRefused as exc:
                raise SignalingError(exc.status, exc.code, str(exc)) from None
        return await _answer(registry, await registry.open(conversation), sdp, new=True, resumable=resumable)
    except SignalingError as exc:
        return exc.response()


async def patch_offer(request: web.Request) -> web.Response:
    try:
        data = await _read_json(request)
        pc_id = _field(data, "pc_id", str)
        candidates = _field(data, "candidates", list)
        if len(candidates) > MAX_CANDIDATES:
            raise SignalingError(400, "invalid_field", f"at most {MAX_CANDIDATES} candidates per request")
        session = _session(request, pc_id)
        for entry in candidates:
            if not isinstance(entry, dict):
                raise SignalingError(400, "invalid_field", "each candidate must be an object")
            text = _field(entry, "candidate", str)
            sdp_mid = _field(entry, "sdp_mid", str, required=False)
            sdp_mline_index = _field(entry, "sdp_mline_index", int, required=False)
            if not text:  # end of candidates
                await session.pc.addIceCandidate(None)
                continue
            try:
                candidate = candidate_from_sdp(text.removeprefix("candidate:"))
            except (AssertionError, ValueError, IndexError) as exc:
                raise SignalingError(400, "invalid_candidate", f"candidate does not parse: {exc!r}") from None
            candidate.sdpMid = sdp_mid
            candidate.sdpMLineIndex = sdp_mline_index
            try:
                await session.pc.addIceCandidate(candidate)
            except ValueError as exc:
                raise SignalingError(400, "invalid_candidate", str(exc)) from None
        return web.Response(status=204)
    except SignalingError as exc:
        return exc.response()


async def delete_offer(request: web.Request) -> web.Response:
    """``{"pc_id"}``: the page hangs up on purpose; the conversation ends now (it is not kept for a resume)."""
    try:
        data = await _read_json(request)
        pc_id = _field(data, "pc_id", str)
        if not await request.app[WEBRTC_PEERS].hang_up(pc_id):
            raise SignalingError(404, "unknown_pc_id", f"no peer connection {pc_id!r}")
        return web.Response(status=204)
    except SignalingError as exc:
        return exc.response()


def register_webrtc_routes(
    app: web.Application, backend: DuplexBackend, *, host_address: str, resume_grace_s: float = 30.0,
    cpu_guard: CpuGuard | None = None, **audio_options: Any
) -> PeerRegistry:
    """Add the signaling routes and a shutdown hook closing every peer.

    ``host_address`` is the local non-loopback address offered to ICE;
    ``audio_options`` go to each call's PeerSession (opus_bitrate, media_timeout_s, consent_expiry_s,
    tools: the worker's ToolBox) and CallAudioPath (overlap_policy, ...); a negative media_timeout_s
    is a ValueError here.
    """
    if audio_options.get("media_timeout_s", 0) < 0:
        raise ValueError(f"media_timeout must be 0 (off) or a positive number of seconds, "
                         f"not {audio_options['media_timeout_s']!r}")
    registry = PeerRegistry(backend, host_address, audio_options, resume_grace_s, cpu_guard)
    app[WEBRTC_PEERS] = registry
    app.router.add_post("/api/offer", post_offer)
    app.router.add_patch("/api/offer", patch_offer)
    app.router.add_delete("/api/offer", delete_offer)
    app.on_shutdown.append(registry.close_all)
    return registry
