"""One participant's session: signal requests, publisher/subscriber peer connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiortc import RTCPeerConnection, RTCRtpTransceiver, RTCSessionDescription
from livekit.protocol import models, rtc

from . import media_relay
from .aiortc_seams import set_msid_stream
from .ids import new_sid
from .publisher_answer import configure_publisher_answer, red_payload_types
from .subscriber_offer import offer_red, red_taken

if TYPE_CHECKING:
    from .room import Room

log = logging.getLogger(__name__)

NEGOTIATION_TIMEOUT = 10.0


@dataclass
class PublishedTrack:
    info: models.TrackInfo
    cid: str
    publisher: Participant
    fanout: media_relay.AudioForwarder | media_relay.TrackFanout | None = None


@dataclass
class Subscription:
    track: PublishedTrack
    relayed: media_relay.ForwardedAudioTrack | media_relay.RelayedTrack
    transceiver: RTCRtpTransceiver
    disabled: bool = False


@dataclass
class ParticipantOptions:
    auto_subscribe: bool = True
    client_protocol: int = 0
    capabilities: list[int] = field(default_factory=list)
    sdk: str = ""


class Participant:
    def __init__(
        self,
        room: Room,
        info: models.ParticipantInfo,
        send: Callable[[rtc.SignalResponse], Awaitable[None]],
        options: ParticipantOptions,
        allowed_ips: set[str],
    ) -> None:
        self.room = room
        self.info = info
        self._send = send
        self.options = options
        self._allowed_ips = allowed_ips
        self.hidden = info.permission.hidden
        self.tracks: dict[str, PublishedTrack] = {}  # track sid -> published
        self._pending: dict[str, PublishedTrack] = {}  # cid -> awaiting media
        self.subscriptions: dict[str, Subscription] = {}  # track sid -> subscription
        self.announced = asyncio.Event()  # the room told the others and made its subscriptions
        self.pub_pc: RTCPeerConnection = media_relay.new_peer_connection()
        self.sub_pc: RTCPeerConnection = media_relay.new_peer_connection()
        self._pub_dcs: dict[str, object] = {}
        self._new_media: list = []
        self._sub_dcs: dict[str, object] = {}
        self._sub_dc_backlog: dict[str, list[bytes]] = {}
        self._pending_trickle: dict[int, list] = {0: [], 1: []}
        self._remote_set = {0: False, 1: False}
        self._send_lock = asyncio.Lock()
        self._neg_needed = False
        self._neg_task: asyncio.Task | None = None
        self._answer_fut: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        self.close_transport: Callable[[], Awaitable[object]] | None = None
        self.data_sent: list[models.DataPacket] = []  # packets relayed from this participant
        self._setup_pcs()

    # -- identity helpers -------------------------------------------------
    @property
    def sid(self) -> str:
        return self.info.sid

    @property
    def identity(self) -> str:
        return self.info.identity

    @property
    def kind(self) -> int:
        return self.info.kind

    def bump_version(self) -> None:
        # info.tracks holds copies (protobuf), so rebuild it from the live TrackInfos
        del self.info.tracks[:]
        self.info.tracks.extend(pt.info for pt in self.tracks.values())
        self.info.version += 1

    def spawn(self, coro, name: str) -> asyncio.Task:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def send(self, msg: rtc.SignalResponse) -> None:
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self._send(msg)
            except Exception as e:  # socket gone; the read loop will clean up
                log.debug("signal send to %s failed: %s", self.identity, e)

    # -- peer connection setup --------------------------------------------
    def _setup_pcs(self) -> None:
        for label, opts in (
            (media_relay.RELIABLE_LABEL, {"ordered": True}),
            (media_relay.LOSSY_LABEL, {"ordered": False, "maxRetransmits": 0}),
        ):
            dc = self.sub_pc.createDataChannel(label, **opts)
            self._sub_dcs[label] = dc
            self._sub_dc_backlog[label] = []
            dc.on("open", lambda label=label: self._flush_dc(label))

        @self.pub_pc.on("datachannel")
        def _on_dc(channel) -> None:
            self._pub_dcs[channel.label] = channel
            if channel.label not in (media_relay.RELIABLE_LABEL, media_relay.LOSSY_LABEL):
                return  # e.g. "_data_track": not relayed
            reliable = channel.label == media_relay.RELIABLE_LABEL

            @channel.on("message")
            def _on_message(message) -> None:
                if isinstance(message, (bytes, bytearray)):
                    self.room.relay_data(self, bytes(message), reliable)

        @self.pub_pc.on("track")
        def _on_track(track) -> None:
            self._new_media.append(track)  # handled once the offer is fully applied

        @self.sub_pc.on("connectionstatechange")
        async def _on_sub_state() -> None:
            state = self.sub_pc.connectionState
            if state == "connected" and self.info.state != models.ParticipantInfo.State.ACTIVE:
                self.info.state = models.ParticipantInfo.State.ACTIVE
                self.bump_version()
                await self.room.broadcast_participant(self)

    def _flush_dc(self, label: str) -> None:
        dc = self._sub_dcs[label]
        backlog, self._sub_dc_backlog[label] = self._sub_dc_backlog[label], []
        for data in backlog:
            dc.send(data)

    def send_data(self, data: bytes, reliable: bool) -> None:
        label = media_relay.RELIABLE_LABEL if reliable else media_relay.LOSSY_LABEL
        dc = self._sub_dcs.get(label)
        if dc is None or self.closed:
            return
        if dc.readyState == "open":
            dc.send(data)
        elif dc.readyState == "connecting":
            self._sub_dc_backlog[label].append(data)

    # -- signal requests --------------------------------------------------
    async def handle(self, req: rtc.SignalRequest) -> None:
        which = req.WhichOneof("message")
        if which not in ("ping", "ping_req", "trickle"):
            log.debug("%s -> %s", self.identity, which)
        handler = getattr(self, f"_on_{which}", None)
        if handler is None:
            log.debug("ignoring signal request %s from %s", which, self.identity)
            return
        await handler(getattr(req, which))

    async def _on_ping(self, ts: int) -> None:
        await self.send(rtc.SignalResponse(pong=ts))

    async def _on_ping_req(self, ping: rtc.Ping) -> None:
        pong = rtc.Pong(last_ping_timestamp=ping.timestamp, timestamp=int(time.time() * 1000))
        await self.send(rtc.SignalResponse(pong_resp=pong))

    async def _on_offer(self, sd: rtc.SessionDescription) -> None:
        # publisher negotiation: client offers, we answer
        await self.pub_pc.setRemoteDescription(RTCSessionDescription(sdp=sd.sdp, type="offer"))
        self._remote_set[0] = True
        new_media, self._new_media = self._new_media, []
        red_of_mid = red_payload_types(sd.sdp, self._audio_track_info)  # before the tracks stop being pending
        for track in new_media:
            self._on_media_track(track, sd.sdp, red_of_mid)
        await self._flush_trickle(0)
        answer = await self.pub_pc.createAnswer()
        await self.pub_pc.setLocalDescription(answer)
        # The publisher reads these settings (how it may send); of them, the forwarder needs only RED's.
        sdp = configure_publisher_answer(self.pub_pc.localDescription.sdp, sd.sdp, self._audio_track_info)
        await self.send(rtc.SignalResponse(answer=rtc.SessionDescription(type="answer", sdp=sdp, id=sd.id)))
        await self._check_unpublished(sd.sdp)

    async def _on_answer(self, sd: rtc.SessionDescription) -> None:
        fut = self._answer_fut
        if fut is not None and not fut.done():
            fut.set_result(sd.sdp)

    async def _on_trickle(self, t: rtc.TrickleRequest) -> None:
        target = int(t.target)
        cand = media_relay.parse_trickle(t.candidateInit, self._allowed_ips)
        if cand is None:
            return
        if not self._remote_set[target]:
            self._pending_trickle[target].append(cand)
            return
        await self._add_candidate(target, cand)

    async def _flush_trickle(self, target: int) -> None:
        pending, self._pending_trickle[target] = self._pending_trickle[target], []
        for cand in pending:
            await self._add_candidate(target, cand)

    async def _add_candidate(self, target: int, cand) -> None:
        pc = self.pub_pc if target == 0 else self.sub_pc
        try:
            await pc.addIceCandidate(cand)
        except Exception as e:
            log.debug("addIceCandidate failed: %s", e)

    async def _on_add_track(self, req: rtc.AddTrackRequest) -> None:
        info = models.TrackInfo(
            sid=req.sid or new_sid("TR_"),
            type=req.type,
            name=req.name,
            muted=req.muted,
            width=req.width,
            height=req.height,
            disable_dtx=req.disable_dtx,
            source=req.source,
            stereo=req.stereo,
            disable_red=req.disable_red,
            encryption=req.encryption,
            stream=req.stream,
            mime_type="audio/opus" if req.type == models.TrackType.AUDIO else "video/vp8",
        )
        info.audio_features.extend(req.audio_features)
        info.layers.extend(req.layers)
        self._pending[req.cid] = PublishedTrack(info=info, cid=req.cid, publisher=self)
        await self.send(
            rtc.SignalResponse(track_published=rtc.TrackPublishedResponse(cid=req.cid, track=info))
        )

    async def _on_mute(self, req: rtc.MuteTrackRequest) -> None:
        pt = self.tracks.get(req.sid)
        if pt is None:
            return
        pt.info.muted = req.muted
        self.bump_version()
        await self.room.broadcast_participant(self)

    async def _on_subscription(self, req: rtc.UpdateSubscription) -> None:
        sids = list(req.track_sids)
        for pt in req.participant_tracks:
            sids.extend(pt.track_sids)
        for sid in sids:
            if req.subscribe:
                pub = self.room.find_track(sid)
                if pub is not None and pub.publisher is not self:
                    self.subscribe(pub)
            else:
                self.unsubscribe(sid)

    async def _on_track_setting(self, req: rtc.UpdateTrackSettings) -> None:
        for sid in req.track_sids:
            sub = self.subscriptions.get(sid)
            if sub is not None:
                sub.disabled = req.disabled

    async def _on_update_metadata(self, req: rtc.UpdateParticipantMetadata) -> None:
        self.info.metadata = req.metadata
        if req.name:
            self.info.name = req.name
        for k, v in req.attributes.items():
            if v == "":
                self.info.attributes.pop(k, None)
            else:
                self.info.attributes[k] = v
        self.bump_version()
        if req.request_id:
            await self.send(
                rtc.SignalResponse(
                    request_response=rtc.RequestResponse(
                        request_id=req.request_id, reason=rtc.RequestResponse.Reason.OK,
                        update_metadata=req,
                    )
                )
            )
        await self.room.broadcast_participant(self)

    async def _on_leave(self, req: rtc.LeaveRequest) -> None:
        await self.room.remove_participant(self, models.DisconnectReason.CLIENT_INITIATED)

    # -- publishing -------------------------------------------------------
    def _on_media_track(self, track, offer_sdp: str, red_of_mid: dict[str, int]) -> None:
        mid = receiver = None
        for t in self.pub_pc.getTransceivers():
            if t.receiver.track is track:
                mid, receiver = t.mid, t.receiver
        track_ids = {
            s["mid"]: s["track_id"]
            for s in media_relay.media_sections(offer_sdp)
        }
        msid_track = track_ids.get(mid)
        pending = self._pending.pop(msid_track, None) if msid_track else None
        if pending is None:  # fall back to the oldest pending track of this kind
            want = models.TrackType.AUDIO if track.kind == "audio" else models.TrackType.VIDEO
            for cid, pt in list(self._pending.items()):
                if pt.info.type == want:
                    pending = self._pending.pop(cid)
                    break
        if pending is None:
            log.warning("%s: media track without AddTrackRequest", self.identity)
            return
        pending.info.mid = mid or ""
        pending.fanout = media_relay.make_fanout(track, receiver, pending.info.sid, self.room.forwarding,
                                                 f"{self.room.name}/{self.identity}", red_of_mid.get(mid or ""))
        self.tracks[pending.info.sid] = pending
        self.info.is_publisher = True
        self.bump_version()
        self.spawn(self.room.on_track_published(self, pending), "lk-track-published")

    def _audio_track_info(self, cid: str) -> models.TrackInfo | None:
        """The audio track the publisher added under ``cid`` (its offer's msid track id)."""
        for pt in (*self._pending.values(), *self.tracks.values()):
            if pt.cid == cid and pt.info.type == models.TrackType.AUDIO:
                return pt.info
        return None

    async def _check_unpublished(self, offer_sdp: str) -> None:
        sections = {s["mid"]: s for s in media_relay.media_sections(offer_sdp)}
        gone = [
            pt for pt in self.tracks.values()
            if pt.info.mid and (
                pt.info.mid not in sections
                or sections[pt.info.mid]["direction"] in ("inactive", "recvonly")
                or sections[pt.info.mid]["port"] == "0"
            )
        ]
        for pt in gone:
            await self.unpublish(pt.info.sid)

    async def unpublish(self, track_sid: str) -> None:
        pt = self.tracks.pop(track_sid, None)
        if pt is None:
            return
        self.bump_version()
        await self.room.on_track_unpublished(self, pt)
        if pt.fanout is not None:
            await pt.fanout.stop()
        await self.send(
            rtc.SignalResponse(track_unpublished=rtc.TrackUnpublishedResponse(track_sid=track_sid))
        )

    # -- subscribing ------------------------------------------------------
    def subscribe(self, pub: PublishedTrack) -> None:
        if self.closed or pub.info.sid in self.subscriptions or pub.fanout is None:
            return
        relayed, transceiver = pub.fanout.attach(self.sub_pc, self.identity)
        # msid "<participant sid>|<track sid> <track sid>" is how the SDK maps media to tracks
        set_msid_stream(transceiver.sender, f"{pub.publisher.sid}|{pub.info.sid}")
        self.subscriptions[pub.info.sid] = Subscription(pub, relayed, transceiver)
        self.negotiate_subscriber()
        pub.publisher.spawn(
            pub.publisher.send(
                rtc.SignalResponse(track_subscribed=rtc.TrackSubscribed(track_sid=pub.info.sid))
            ),
            "lk-track-subscribed",
        )

    def unsubscribe(self, track_sid: str) -> None:
        sub = self.subscriptions.pop(track_sid, None)
        if sub is None:
            return
        sub.relayed.stop()
        if not self.closed:
            sub.transceiver.sender.replaceTrack(None)
            sub.transceiver.direction = "inactive"
            self.negotiate_subscriber()

    def negotiate_subscriber(self) -> None:
        """Queue a server-offer renegotiation of the subscriber PC."""
        self._neg_needed = True
        if self._neg_task is None or self._neg_task.done():
            self._neg_task = self.spawn(self._negotiate_loop(), "lk-sub-negotiation")

    async def _negotiate_loop(self) -> None:
        while self._neg_needed and not self.closed:
            self._neg_needed = False
            try:
                offer = await self.sub_pc.createOffer()
                await self.sub_pc.setLocalDescription(offer)
                audio = [s for s in self.subscriptions.values() if isinstance(s.relayed, media_relay.ForwardedAudioTrack)]
                red_mids = {s.transceiver.mid for s in audio if s.relayed.offers_red}
                self._answer_fut = asyncio.get_running_loop().create_future()
                await self.send(
                    rtc.SignalResponse(
                        offer=rtc.SessionDescription(type="offer", sdp=offer_red(self.sub_pc.localDescription.sdp, red_mids))
                    )
                )
                sdp = await asyncio.wait_for(self._answer_fut, NEGOTIATION_TIMEOUT)
                await self.sub_pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
                taken = red_taken(sdp)
                for s in audio:
                    s.relayed.writer.red_payload_type = taken.get(s.transceiver.mid)
                self._remote_set[1] = True
                await self._flush_trickle(1)
            except TimeoutError:
                log.warning("%s: subscriber answer timed out", self.identity)
            except Exception:
                if not self.closed:
                    log.exception("%s: subscriber negotiation failed", self.identity)
                return
            finally:
                self._answer_fut = None

    # -- teardown ---------------------------------------------------------
    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sid in list(self.subscriptions):
            self.subscriptions.pop(sid).relayed.stop()
        for pt in list(self.tracks.values()) + list(self._pending.values()):
            if pt.fanout is not None:
                await pt.fanout.stop()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pc in (self.pub_pc, self.sub_pc):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pc.close(), 5)
        if self.close_transport is not None:
            with contextlib.suppress(Exception):
                await self.close_transport()
