"""One participant's session: signal requests and its peer connections.

On the v0 signal path (``/rtc``) a participant has two: it offers on the publisher one and the
server answers; the server offers on the subscriber one. On the v1 path (``/rtc/v1``, what the
SDKs ask for first) it has one, the publisher one, for both ways, as with LiveKit: the
participant always offers, the server always answers. A track it subscribes to goes out on a
section it offered to receive on; when there are too few, the server asks for more
(``MediaSectionsRequirement``) and the participant offers again. Each answer maps its mids to
the track sids they carry (``mid_to_track_id``), and data to the participant goes on the data
channels it opened.
"""

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

from duplex_agent.webrtc.direct.ice_consent import keep_consent

from . import media_relay
from .aiortc_seams import set_msid_stream, start_sections_once_connected
from .ids import new_sid
from .publisher_answer import configure_publisher_answer, red_payload_types
from .subscriber_offer import answer_red, offer_red, red_taken

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
    single_pc: bool = False  # the v1 signal path: one peer connection, the participant offers


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
        # the v1 path has no subscriber peer connection: what it carried goes on pub_pc
        self.sub_pc: RTCPeerConnection | None = None if options.single_pc else media_relay.new_peer_connection()
        self._to_bind: list[PublishedTrack] = []  # v1: subscribed, waiting for a section to go out on
        self._spent: set[RTCRtpTransceiver] = set()  # v1: sections that carried a track (never reused)
        self._sections_asked = {"audio": 0, "video": 0}  # v1: asked for since the participant's last offer
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
        # A track subscribed while a connection still handshakes (seconds on a lossy link) must
        # still go out once it is up, as LiveKit's down tracks do (bound and connected, either order).
        for pc in (self.pub_pc, self.sub_pc):
            if pc is not None:
                start_sections_once_connected(pc)
        for label in (media_relay.RELIABLE_LABEL, media_relay.LOSSY_LABEL):
            self._sub_dc_backlog[label] = []
        if self.sub_pc is None:
            self._setup_publisher_pc()

            @self.pub_pc.on("connectionstatechange")
            async def _on_state() -> None:
                await self._connected(self.pub_pc)

            return
        for label, opts in (
            (media_relay.RELIABLE_LABEL, {"ordered": True}),
            (media_relay.LOSSY_LABEL, {"ordered": False, "maxRetransmits": 0}),
        ):
            dc = self.sub_pc.createDataChannel(label, **opts)
            self._sub_dcs[label] = dc
            dc.on("open", lambda label=label: self._flush_dc(label))
        self._setup_publisher_pc()

        @self.sub_pc.on("connectionstatechange")
        async def _on_sub_state() -> None:
            await self._connected(self.sub_pc)

    def _setup_publisher_pc(self) -> None:
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

            if self.sub_pc is None:  # v1: data to this participant goes on its own channels
                self._sub_dcs[channel.label] = channel
                if channel.readyState == "open":
                    self._flush_dc(channel.label)
                else:
                    channel.on("open", lambda label=channel.label: self._flush_dc(label))

        @self.pub_pc.on("track")
        def _on_track(track) -> None:
            self._new_media.append(track)  # handled once the offer is fully applied

    async def _connected(self, pc: RTCPeerConnection) -> None:
        """The peer connection that carries what the participant receives connected: it is active."""
        if pc.connectionState == "connected" and self.info.state != models.ParticipantInfo.State.ACTIVE:
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
        if self.closed:
            return
        if dc is None:  # v1: until the participant's own channel comes
            if self.sub_pc is None:
                self._sub_dc_backlog[label].append(data)
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
        # publisher negotiation (on v1, all of it): client offers, we answer
        await self.pub_pc.setRemoteDescription(RTCSessionDescription(sdp=sd.sdp, type="offer"))
        keep_consent(self.pub_pc)  # RFC 7675's 30 s, as LiveKit's ICE allows, not aioice's few seconds
        self._remote_set[0] = True
        new_media, self._new_media = self._new_media, []
        log.debug("%s/%s: publisher offer %s with %d new track(s), %d pending", self.room.name, self.identity,
                  sd.id, len(new_media), len(self._pending))
        red_of_mid = red_payload_types(sd.sdp, self._audio_track_info)  # before the tracks stop being pending
        for track in new_media:
            self._on_media_track(track, sd.sdp, red_of_mid)
        if self.sub_pc is None:
            self._sections_asked = {"audio": 0, "video": 0}
            self._bind_subscriptions(sd.sdp)
        await self._flush_trickle(0)
        answer = await self.pub_pc.createAnswer()
        await self.pub_pc.setLocalDescription(answer)
        # The publisher reads these settings (how it may send); of them, the forwarder needs only RED's.
        sdp = configure_publisher_answer(self.pub_pc.localDescription.sdp, sd.sdp, self._audio_track_info)
        reply = rtc.SessionDescription(type="answer", sdp=sdp, id=sd.id)
        if self.sub_pc is None:
            reply.sdp = self._answer_subscriptions(sdp, sd.sdp)
            reply.mid_to_track_id.update({s.transceiver.mid: sid for sid, s in self.subscriptions.items()
                                          if s.transceiver.mid})
        await self.send(rtc.SignalResponse(answer=reply))
        await self._check_unpublished(sd.sdp)
        if self.sub_pc is None and self._to_bind:
            await self._ask_for_sections()

    async def _on_answer(self, sd: rtc.SessionDescription) -> None:
        fut = self._answer_fut
        if fut is not None and not fut.done():
            fut.set_result(sd.sdp)

    async def _on_trickle(self, t: rtc.TrickleRequest) -> None:
        target = int(t.target) if self.sub_pc is not None else 0  # v1: one peer connection
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
        log.debug("%s/%s: add track %s (cid %s)", self.room.name, self.identity, info.sid, req.cid)
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
        log.debug("%s/%s: track %s published (mid %s)", self.room.name, self.identity, pending.info.sid, mid)
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
        if self.sub_pc is None:  # v1: on a section the participant offers to receive on
            if pub not in self._to_bind:
                self._to_bind.append(pub)
                self.negotiate_subscriber()
            return
        self._attach(pub, self.sub_pc)
        self.negotiate_subscriber()

    def _attach(self, pub: PublishedTrack, pc: RTCPeerConnection, transceiver: RTCRtpTransceiver | None = None) -> None:
        assert pub.fanout is not None
        relayed, transceiver = pub.fanout.attach(pc, self.identity, transceiver)
        # msid "<participant sid>|<track sid> <track sid>" is how the SDK maps media to tracks
        set_msid_stream(transceiver.sender, f"{pub.publisher.sid}|{pub.info.sid}")
        self.subscriptions[pub.info.sid] = Subscription(pub, relayed, transceiver)
        log.debug("%s/%s: subscribed to %s of %s", self.room.name, self.identity, pub.info.sid, pub.publisher.identity)
        pub.publisher.spawn(
            pub.publisher.send(
                rtc.SignalResponse(track_subscribed=rtc.TrackSubscribed(track_sid=pub.info.sid))
            ),
            "lk-track-subscribed",
        )

    def unsubscribe(self, track_sid: str) -> None:
        self._to_bind = [pub for pub in self._to_bind if pub.info.sid != track_sid]
        sub = self.subscriptions.pop(track_sid, None)
        if sub is None:
            return
        sub.relayed.stop()
        if not self.closed:
            sub.transceiver.sender.replaceTrack(None)
            sub.transceiver.direction = "inactive"
            self.negotiate_subscriber()

    # -- v1: the participant offers the sections its subscriptions go out on --
    def _bind_subscriptions(self, offer_sdp: str) -> None:
        """Each track waiting to go out takes a section of ``offer_sdp`` the participant offered to
        receive on (of its kind, never used before), before the answer is made."""
        receiving = {s["mid"] for s in media_relay.media_sections(offer_sdp)
                     if s["direction"] == "recvonly" and s["port"] != "0"}
        free = [t for t in self.pub_pc.getTransceivers()
                if t.mid in receiving and t not in self._spent and t.sender.track is None]
        for pub in list(self._to_bind):
            kind = "audio" if pub.info.type == models.TrackType.AUDIO else "video"
            transceiver = next((t for t in free if t.kind == kind), None)
            if transceiver is None:
                continue
            free.remove(transceiver)
            self._to_bind.remove(pub)
            self._spent.add(transceiver)
            if pub.fanout is not None:
                self._attach(pub, self.pub_pc, transceiver)

    def _answer_subscriptions(self, answer_sdp: str, offer_sdp: str) -> str:
        """The answer with RED first in the sections of audio tracks published with RED, where the
        participant offered RED; each forwarder then sends RED, or the primary alone."""
        audio = [s for s in self.subscriptions.values() if isinstance(s.relayed, media_relay.ForwardedAudioTrack)]
        sdp, taken = answer_red(answer_sdp, offer_sdp, {s.transceiver.mid for s in audio if s.relayed.offers_red})
        for s in audio:
            s.relayed.writer.red_payload_type = taken.get(s.transceiver.mid)
        return sdp

    async def _ask_for_sections(self, *, always: bool = False) -> None:
        """Ask the participant for the receiving sections its waiting tracks lack, as LiveKit does
        (``MediaSectionsRequirement``); ``always``: ask even for none, so that it offers again
        (a section now carries a track, or no longer does)."""
        wanted = {"audio": 0, "video": 0}
        for pub in self._to_bind:
            wanted["audio" if pub.info.type == models.TrackType.AUDIO else "video"] += 1
        more = {kind: max(0, n - self._sections_asked[kind]) for kind, n in wanted.items()}
        if not always and not any(more.values()):
            return
        for kind, n in more.items():
            self._sections_asked[kind] += n
        await self.send(rtc.SignalResponse(media_sections_requirement=rtc.MediaSectionsRequirement(
            num_audios=more["audio"], num_videos=more["video"])))

    def negotiate_subscriber(self) -> None:
        """Queue a server-offer renegotiation of the subscriber PC (v1: ask the participant to offer)."""
        if self.sub_pc is None:
            if not self.closed:
                self.spawn(self._ask_for_sections(always=True), "lk-media-sections")
            return
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
                keep_consent(self.sub_pc)
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
            if pc is None:
                continue
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pc.close(), 5)
        if self.close_transport is not None:
            with contextlib.suppress(Exception):
                await self.close_transport()
