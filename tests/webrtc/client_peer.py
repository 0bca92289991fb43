"""An aiortc client peer for tests: sends a track, collects what comes back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import numpy as np
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.ice_consent import keep_consent
from duplex_agent.webrtc.direct.tracks import PlayoutTrack, frame_to_mono_f32


def frames_of(audio: np.ndarray) -> Callable[[], np.ndarray]:
    """A next_frame source playing ``audio`` (float32 48 kHz) once, then silence."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    position = 0

    def next_frame() -> np.ndarray:
        nonlocal position
        frame = np.zeros(960, dtype=np.int16)
        chunk = pcm[position : position + 960]
        frame[: chunk.size] = chunk
        position += 960
        return frame

    return next_frame


class ClientPeer:
    def __init__(self, host_address: str, next_frame: Callable[[], np.ndarray]) -> None:
        self.host_address = host_address
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("events")
        self.messages: list[dict] = []
        self.received: list[np.ndarray] = []  # mono float32 48 kHz frames
        self.pc_id: str | None = None
        self.answer_sdp: str | None = None
        self._readers: list[asyncio.Task] = []
        self.pc.addTrack(PlayoutTrack(next_frame))
        self.channel.on("message", lambda m: self.messages.append(json.loads(m)))
        self.pc.on("track", self._on_track)

    def _on_track(self, track) -> None:
        async def read() -> None:
            try:
                while True:
                    self.received.append(frame_to_mono_f32(await track.recv()))
            except MediaStreamError:
                pass

        self._readers.append(asyncio.create_task(read()))

    async def connect(self, http: TestClient) -> None:
        with candidates_on(self.host_address):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        response = await http.post("/api/offer", json={"sdp": self.pc.localDescription.sdp, "type": "offer"})
        assert response.status == 200, await response.text()
        answer = await response.json()
        self.pc_id, self.answer_sdp = answer["pc_id"], answer["sdp"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        keep_consent(self.pc)  # as a browser keeps it (RFC 7675's 30 s), not aioice's few seconds

    def loud_frames(self, threshold: float = 0.02) -> int:
        return sum(float(np.sqrt(np.mean(f**2))) > threshold for f in self.received)

    def message_types(self) -> list[str]:
        return [m.get("type") for m in self.messages]

    async def close(self) -> None:
        await self.pc.close()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


