"""One browser peer: an aiortc connection bound to one duplex conversation.

The session owns everything it starts (the caller reader, the playout track and
the loss follower that sets its FEC, the metrics ticker, the connect deadline, the
media timeout) and closes it all, with the conversation, when the peer goes.

A caller whose RTP stops for ``media_timeout_s`` once connected (0: never) is told
why on the data channel (``error`` ``media_timeout``, then ``session.closed`` with
that reason) and the call ends; packets that return sooner keep the call.

ICE consent freshness on the peer's connection is ours (``ice_consent``, started by
``watch_transport`` once the offer is set): checks the caller leaves unanswered for
``consent_expiry_s`` end the call (``error`` ``consent_expired``, the reason in the log and
counted in /metrics), and answers held up by a busy loop, the caller's or ours, still count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from duplex_agent.agent.metrics import ACTIVE_SESSIONS, ERRORS
from duplex_agent.agent.protocol.codec import decode_client_event, encode_event
from duplex_agent.agent.protocol.events import (
    ErrorEvent,
    InputDtmf,
    ProtocolError,
    ResponseTranscriptDelta,
    ServerEvent,
    SessionClosed,
    SessionUpdate,
)
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.webrtc.direct.call_control import DirectCallControl
from duplex_agent.webrtc.direct.caller_receive import AdaptiveCallerAudioReader
from duplex_agent.webrtc.direct.datagram_guard import EmptyDatagramGuard, drop_empty_datagrams
from duplex_agent.webrtc.direct.ice_consent import CONSENT_EXPIRY_S, ConsentKeeper, ConsentLost, keep_consent
from duplex_agent.webrtc.direct.loss_feedback import LossFollower
from duplex_agent.webrtc.direct.media_timeout import MediaWatchdog
from duplex_agent.webrtc.direct.tracks import DEFAULT_OPUS_BITRATE, PlayoutTrack
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.transcript_deltas import TranscriptDeltas

if TYPE_CHECKING:
    from duplex_agent.agent.tools.toolbox import ToolBox

logger = logging.getLogger("duplex_agent.webrtc")

EVENTS_CHANNEL = "events"
TRANSPORT = "webrtc"
CONNECT_TIMEOUT_S = 30.0
#: Metrics go out at most this often, and only when a figure the page shows changed
#: (or when the page sends ``metrics.request``).
METRICS_INTERVAL_S = 5.0
METRICS_REQUEST = "metrics.request"
_EARLY_MESSAGES_KEPT = 200  # page messages queued until the data channel opens
_MAX_PAGE_MESSAGE = 16 * 1024
#: Seconds without the caller's RTP that end a direct call (the ``media_timeout`` setting's default).
DEFAULT_MEDIA_TIMEOUT_S = 20.0
MEDIA_TIMEOUT = "media_timeout"
#: The agent ended the call (a tool's hang-up).
HUNG_UP = "hung_up"


class PeerSession:
    def __init__(
        self,
        pc_id: str,
        pc: RTCPeerConnection,
        conversation: Conversation,
        *,
        on_finished: Callable[[PeerSession, str], None],
        opus_bitrate: int = DEFAULT_OPUS_BITRATE,
        media_timeout_s: float = DEFAULT_MEDIA_TIMEOUT_S,
        tools: ToolBox | None = None,
        consent_expiry_s: float = CONSENT_EXPIRY_S,
        **audio_options: Any,
    ) -> None:
        self.pc_id = pc_id
        self.pc = pc
        self.conversation = conversation
        self._on_finished = on_finished
        call_tools = tools.for_call(CallInfo(self, pc_id, DirectCallControl(self.hang_up))) if tools else None
        self.audio = CallAudioPath(
            conversation, on_event=self._forward_event, on_state=self._forward_state,
            on_closed=lambda: self.finish("conversation_closed"), tools=call_tools, **audio_options,
        )
        self.playout_track = PlayoutTrack(self.audio.next_frame, bitrate=opus_bitrate)
        self.loss_follower = LossFollower(self.playout_track.encoder)
        self.caller_reader: AdaptiveCallerAudioReader | None = None
        self.media_timeout_s = media_timeout_s
        self._media_watch: MediaWatchdog | None = None
        self.consent_expiry_s = consent_expiry_s
        self.consent: list[ConsentKeeper] = []
        self.datagram_guards: list[EmptyDatagramGuard] = []
        self._channel: RTCDataChannel | None = None
        self._early: deque[str] = deque(maxlen=_EARLY_MESSAGES_KEPT)
        self._tasks: list[asyncio.Task[None]] = []
        self._deltas = TranscriptDeltas(lambda delta: self._send(encode_event(delta)))
        self._metrics_sent: Any = None  # what the page showed when metrics last went out
        self.closed = False

        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)

    async def start(self) -> None:
        await self.audio.start()
        ACTIVE_SESSIONS.labels(transport=TRANSPORT).inc()
        self._tasks.append(asyncio.create_task(self._connect_deadline(), name=f"peer-{self.pc_id}-deadline"))
        self._tasks.append(asyncio.create_task(self._send_metrics(), name=f"peer-{self.pc_id}-metrics"))

    def finish(self, reason: str) -> None:
        """Ask the owner to close this session (safe from any callback)."""
        if not self.closed:
            self._on_finished(self, reason)

    def hang_up(self, reason: str) -> None:
        """The agent ends the call (a tool's hang-up): the page is told why, then the peer closes."""
        logger.info("peer %s: the agent hangs up (%s)", self.pc_id, reason)
        self._forward_event(SessionClosed(HUNG_UP))
        self.finish(HUNG_UP)

    async def close(self, reason: str, *, keep_conversation: bool = False) -> None:
        """Close the peer and all it started; the conversation too unless ``keep_conversation`` (for a resume)."""
        if self.closed:
            return
        self.closed = True
        logger.info("peer %s closing: %s", self.pc_id, reason)
        self._deltas.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._media_watch is not None:
            self._media_watch.close()
        if self.caller_reader is not None:
            await self.caller_reader.close()
        await self.audio.close()
        self.playout_track.stop()
        try:
            if not keep_conversation:
                await self.conversation.close(reason)
        finally:
            await self.pc.close()
            ACTIVE_SESSIONS.labels(transport=TRANSPORT).dec()

    def watch_transport(self) -> None:
        """Once the caller's offer is set: ICE consent on this peer's connections is judged by
        ``ice_consent``, and the datagrams aiortc must not see are dropped (``datagram_guard``)."""
        self.consent = keep_consent(self.pc, self._consent_lost, expiry_s=self.consent_expiry_s)
        self.datagram_guards = drop_empty_datagrams(self.pc)

    # ---- peer connection callbacks ----

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self.caller_reader is not None:
            return
        sender = self.pc.addTrack(self.playout_track)
        self._tasks.append(asyncio.create_task(self.loss_follower.follow(sender), name=f"peer-{self.pc_id}-loss"))
        receiver = next(t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track)
        self.caller_reader = AdaptiveCallerAudioReader(receiver, self.audio.push_caller_frame, call_id=self.pc_id,
                                                       on_ended=lambda: self.finish("track_ended"))
        if self.media_timeout_s > 0:
            reader = self.caller_reader
            self._media_watch = MediaWatchdog(self.media_timeout_s, lambda: reader.last_packet_at,
                                              self._media_timed_out)
            if self.pc.connectionState == "connected":
                self._media_watch.start()

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self._on_page_message)
        channel.on("close", lambda: self.finish("data_channel_closed"))
        while self._early:
            channel.send(self._early.popleft())
        if channel.readyState == "open":
            self._send_metrics_now()
        else:
            channel.on("open", self._send_metrics_now)

    def _on_connection_state(self) -> None:
        if self.pc.connectionState == "connected" and self._media_watch is not None:
            self._media_watch.start()  # the caller's media is due from now (a slow connect is connect_timeout's)
        if self.pc.connectionState in ("failed", "closed"):
            self.finish(f"connection_{self.pc.connectionState}")

    def _media_timed_out(self) -> None:
        """No RTP from the caller for the media timeout: say why (the page shows it), then hang up."""
        logger.warning("peer %s: no audio from the caller for %g s, ending the call", self.pc_id, self.media_timeout_s)
        self._forward_event(ErrorEvent.of(MEDIA_TIMEOUT, f"no audio from the caller for {self.media_timeout_s:g} s: "
                                          "the call is ended", error_type="server_error"))
        self._forward_event(SessionClosed(MEDIA_TIMEOUT))
        self.finish(MEDIA_TIMEOUT)

    def _consent_lost(self, lost: ConsentLost) -> None:
        """The caller stopped answering ICE consent checks (or revoked consent): the path to it is gone,
        so the call ends as a failed connection does (a resumable one is kept for its resume); the
        error goes out in case the page still hears, and is counted."""
        logger.warning("peer %s: %s, ending the call", self.pc_id, lost)
        self._forward_event(ErrorEvent.of(lost.code, f"{lost}: the call is ended", error_type="server_error"))
        self.finish(lost.code)

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            self.finish("connect_timeout")

    # ---- data channel ----

    def _send(self, message: dict[str, Any]) -> None:
        text = json.dumps(message, separators=(",", ":"))
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(text)
        elif self._channel is None:
            self._early.append(text)

    def _forward_event(self, event: ServerEvent) -> None:
        if isinstance(event, ResponseTranscriptDelta):
            self._deltas.hold(event)
            return
        self._deltas.flush()  # what the page gets keeps the conversation's order
        if isinstance(event, ErrorEvent):
            ERRORS.labels(code=event.code).inc()
        self._send(encode_event(event))

    def _forward_state(self, state: str) -> None:
        self._send({"type": "agent.state", "state": state})

    def _send_error(self, exc: ProtocolError) -> None:
        self._forward_event(ErrorEvent.from_exception(exc))

    def _on_page_message(self, message: str | bytes) -> None:
        try:
            if len(message) > _MAX_PAGE_MESSAGE:
                raise ProtocolError("message_too_large", f"data channel messages are limited to {_MAX_PAGE_MESSAGE} bytes")
            if _is_metrics_request(message):
                self._send_metrics_now()
                return
            event = decode_client_event(message)
            if isinstance(event, SessionUpdate):
                self.audio.update_session(event.session)
            elif isinstance(event, InputDtmf):
                self.conversation.send(event)
            else:
                raise ProtocolError("unsupported_event", f"{event.type} is not accepted on the data channel", event_id=event.event_id)
        except ProtocolError as exc:
            self._send_error(exc)

    async def _send_metrics(self) -> None:
        while True:
            await asyncio.sleep(METRICS_INTERVAL_S)
            if self.audio.page_figures() != self._metrics_sent:
                self._send_metrics_now()

    def _send_metrics_now(self) -> None:
        self._metrics_sent = self.audio.page_figures()
        self._send(self.audio.figures_message())


def _is_metrics_request(message: str | bytes) -> bool:
    """``{"type": "metrics.request"}``: the page asks for the figures now (a data-channel extra)."""
    if METRICS_REQUEST.encode() not in (message.encode() if isinstance(message, str) else message):
        return False
    try:
        return json.loads(message).get("type") == METRICS_REQUEST
    except (ValueError, AttributeError):
        return False
