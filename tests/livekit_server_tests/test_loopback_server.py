"""Tests for the loopback LiveKit server, driven by the real livekit SDK and agents worker."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from livekit import api, rtc
from livekit.protocol import agent as agent_pb
from livekit.protocol import models as models_pb
from livekit.protocol import rtc as rtc_pb

from devtools.livekit_server import LoopbackLiveKitServer

from .peers import SineFeeder, eventually, future, join, resolve

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
]


# -- signalling basics -----------------------------------------------------

async def test_validate_endpoint(server: LoopbackLiveKitServer) -> None:
    http = server.url.replace("ws://", "http://")
    async with aiohttp.ClientSession() as s:
        ok = await s.get(f"{http}/rtc/validate",
                         params={"access_token": server.mint_token("x", "r")})
        assert ok.status == 200
        bad = await s.get(f"{http}/rtc/validate", params={"access_token": "nope"})
        assert bad.status == 401
        # v1, as livekit-server answers it: the token first, then the join request it needs
        assert (await s.get(f"{http}/rtc/v1/validate")).status == 401
        token = server.mint_token("x", "r")
        assert (await s.get(f"{http}/rtc/v1/validate", params={"access_token": token})).status == 400
        request = rtc_pb.JoinRequest(client_info=models_pb.ClientInfo(protocol=16))
        join_request = rtc_pb.WrappedJoinRequest(join_request=request.SerializeToString())
        param = base64.urlsafe_b64encode(join_request.SerializeToString()).decode()
        v1 = await s.get(f"{http}/rtc/v1/validate", params={"access_token": token, "join_request": param})
        assert v1.status == 200 and await v1.text() == "success"
        assert (await s.get(f"{http}/rtc/v1", params={"access_token": token})).status == 404  # not a websocket


async def test_the_sdk_joins_on_the_v1_path_and_nothing_it_asks_for_is_missing(server: LoopbackLiveKitServer,
                                                                               rooms) -> None:
    """The Rust SDK asks for /rtc/v1 first (one peer connection) and falls back to /rtc only on a
    404, logging "signal connection failed on v1 path": served, no request of a join, a publish,
    a subscription and a leave gets a 404."""
    a = await join(server, rooms, "alice", "v1-room")
    b = await join(server, rooms, "bob", "v1-room")
    subscribed = future()
    b.on("track_subscribed", lambda track, pub, p: resolve(subscribed, track.sid))
    with SineFeeder() as feeder:
        opts = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        pub = await asyncio.wait_for(a.local_participant.publish_track(feeder.track, opts), 10)
        assert await asyncio.wait_for(subscribed, 10) == pub.sid
        # one peer connection each: bob's copy goes out on a section bob offered to receive on
        await eventually(lambda: pub.sid in server.rooms["v1-room"].participants["bob"].subscriptions)
    for room in list(rooms):
        await asyncio.wait_for(room.disconnect(), 20)
        rooms.remove(room)
    await eventually(lambda: len([r for r in server.http_requests() if r[1] == "/rtc/v1"]) == 2, 10)
    requests = server.http_requests()
    assert [r for r in requests if r[2] == 404] == [], requests
    assert {r for r in requests if r[1].startswith("/rtc")} == {("GET", "/rtc/v1", 101)}, requests


async def test_invalid_token_is_rejected(server: LoopbackLiveKitServer) -> None:
    wrong = api.AccessToken("devkey", "another-secret-entirely").with_identity("m") \
        .with_grants(api.VideoGrants(room_join=True, room="r")).to_jwt()
    r = rtc.Room()
    with pytest.raises(rtc.ConnectError):
        await asyncio.wait_for(r.connect(server.url, wrong), 15)


# -- media -----------------------------------------------------------------

async def test_audio_relay_and_presence(server: LoopbackLiveKitServer, rooms) -> None:
    a = await join(server, rooms, "alice", "media-room")
    b = await join(server, rooms, "bob", "media-room")
    await eventually(lambda: "bob" in a.remote_participants and "alice" in b.remote_participants)

    subscribed = future()
    b.on("track_subscribed", lambda track, pub, p: resolve(subscribed, (track, p)))

    feeder = SineFeeder().__enter__()
    stream = None
    try:
        opts = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        pub = await asyncio.wait_for(a.local_participant.publish_track(feeder.track, opts), 10)
        remote_track, participant = await asyncio.wait_for(subscribed, 10)
        assert participant.identity == "alice"
        assert remote_track.sid == pub.sid
        assert pub.sid in b.remote_participants["alice"].track_publications

        stream = rtc.AudioStream(remote_track, sample_rate=48000, num_channels=1)
        chunks: list[np.ndarray] = []

        async def read() -> None:
            async for ev in stream:
                chunks.append(np.frombuffer(ev.frame.data, dtype=np.int16))
                if len(chunks) >= 80:
                    return

        await asyncio.wait_for(read(), 10)
        sig = np.concatenate(chunks[20:]).astype(np.float64)
        spectrum = np.abs(np.fft.rfft(sig))
        freqs = np.fft.rfftfreq(len(sig), 1 / 48000)
        peak = freqs[int(np.argmax(spectrum))]
        assert abs(peak - 440) < 10, peak
        power = spectrum**2
        band = power[(freqs > 400) & (freqs < 480)].sum()
        assert band / power.sum() > 0.3  # tolerant of concealment glitches on a busy machine
        assert np.sqrt(np.mean(sig**2)) > 1000
    finally:
        feeder.__exit__()
        if stream is not None:
            await stream.aclose()


async def test_late_joiner_mute_unpublish_manual_subscribe(server: LoopbackLiveKitServer,
                                                            rooms) -> None:
    a = await join(server, rooms, "alice", "pub-room")
    with SineFeeder() as feeder:
        opts = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        pub = await asyncio.wait_for(a.local_participant.publish_track(feeder.track, opts), 10)

        # a late joiner is subscribed to the existing track
        b_sub, b_muted, b_unpub = future(), future(), future()
        b = rtc.Room()
        rooms.append(b)
        b.on("track_subscribed", lambda t, p, who: resolve(b_sub, t.sid))
        b.on("track_muted", lambda who, p: resolve(b_muted, p.sid))
        b.on("track_unpublished", lambda p, who: resolve(b_unpub, p.sid))
        await asyncio.wait_for(b.connect(server.url, server.mint_token("bob", "pub-room")), 15)
        assert await asyncio.wait_for(b_sub, 10) == pub.sid

        # auto_subscribe=False: nothing until the participant asks for it
        c_sub = future()
        c = rtc.Room()
        rooms.append(c)
        c.on("track_subscribed", lambda t, p, who: resolve(c_sub, t.sid))
        await asyncio.wait_for(c.connect(server.url, server.mint_token("carol", "pub-room"),
                                         rtc.RoomOptions(auto_subscribe=False)), 15)
        await eventually(lambda: pub.sid in c.remote_participants["alice"].track_publications)
        # The server's own record, once it has made carol's join subscriptions (none, asked for none).
        await eventually(lambda: server.rooms["pub-room"].participants["carol"].announced, 10)
        assert server.rooms["pub-room"].participants["carol"].subscriptions == {}
        assert not c_sub.done()
        c.remote_participants["alice"].track_publications[pub.sid].set_subscribed(True)
        assert await asyncio.wait_for(c_sub, 10) == pub.sid

        feeder.track.mute()
        assert await asyncio.wait_for(b_muted, 5) == pub.sid
        await a.local_participant.unpublish_track(pub.sid)
        assert await asyncio.wait_for(b_unpub, 10) == pub.sid
        await eventually(lambda: not server.rooms["pub-room"].participants["alice"].tracks)


# -- data ------------------------------------------------------------------

async def test_data_and_text_streams(server: LoopbackLiveKitServer, rooms) -> None:
    a = await join(server, rooms, "alice", "data-room")
    b = await join(server, rooms, "bob", "data-room")
    await eventually(lambda: "alice" in b.remote_participants)

    packet = future()
    b.on("data_received", lambda pkt: resolve(packet, pkt))
    texts: dict[str, asyncio.Future] = {"lk.transcription": future(), "chat": future()}

    def handler(topic: str):
        def _on_stream(reader: rtc.TextStreamReader, identity: str) -> None:
            async def _read() -> None:
                text = await reader.read_all()
                resolve(texts[topic], (identity, text, dict(reader.info.attributes)))
            asyncio.ensure_future(_read())
        return _on_stream

    for topic in texts:
        b.register_text_stream_handler(topic, handler(topic))

    await a.local_participant.publish_data(b"hello", reliable=True, topic="t1")
    pkt = await asyncio.wait_for(packet, 5)
    assert pkt.data == b"hello" and pkt.topic == "t1"
    assert pkt.participant is not None and pkt.participant.identity == "alice"

    writer = await a.local_participant.stream_text(
        topic="lk.transcription",
        attributes={"lk.transcribed_track_id": "TR_x", "lk.transcription_final": "true"},
    )
    for part in ("hello ", "from ", "alice"):
        await writer.write(part)
    await writer.aclose()
    identity, text, attrs = await asyncio.wait_for(texts["lk.transcription"], 5)
    assert (identity, text) == ("alice", "hello from alice")
    assert attrs["lk.transcription_final"] == "true"

    await a.local_participant.send_text("x" * 5000, topic="chat", attributes={"k": "v"})
    identity, text, attrs = await asyncio.wait_for(texts["chat"], 5)
    assert identity == "alice" and text == "x" * 5000 and attrs == {"k": "v"}


async def test_rpc_round_trip(server: LoopbackLiveKitServer, rooms) -> None:
    a = await join(server, rooms, "alice", "rpc-room")
    b = await join(server, rooms, "bob", "rpc-room")
    await eventually(lambda: "bob" in a.remote_participants)

    @b.local_participant.register_rpc_method("echo")
    async def _echo(data: rtc.RpcInvocationData) -> str:
        return f"{data.caller_identity}:{data.payload}"

    reply = await asyncio.wait_for(
        a.local_participant.perform_rpc(destination_identity="bob", method="echo", payload="hi"), 10
    )
    assert reply == "alice:hi"


# -- participant state -----------------------------------------------------

async def test_attributes_and_kind(server: LoopbackLiveKitServer, rooms) -> None:
    a = await join(server, rooms, "alice", "attr-room")
    b = await join(server, rooms, "caller", "attr-room", kind="sip",
                   attributes={"sip.phoneNumber": "+15550100"})
    await eventually(lambda: "caller" in a.remote_participants and "alice" in b.remote_participants)
    sip = a.remote_participants["caller"]
    assert sip.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP
    assert sip.attributes["sip.phoneNumber"] == "+15550100"

    changed = future()
    b.on("participant_attributes_changed", lambda attrs, p: resolve(changed, (dict(attrs), p)))
    await asyncio.wait_for(a.local_participant.set_attributes({"lk.agent.state": "speaking"}), 5)
    attrs, p = await asyncio.wait_for(changed, 5)
    assert p.identity == "alice" and attrs == {"lk.agent.state": "speaking"}
    assert b.remote_participants["alice"].attributes["lk.agent.state"] == "speaking"
    assert server.rooms["attr-room"].participants["alice"].info.attributes["lk.agent.state"] \
        == "speaking"


async def test_leave_and_room_close(server: LoopbackLiveKitServer, rooms) -> None:
    a = await join(server, rooms, "alice", "leave-room")
    b = await join(server, rooms, "bob", "leave-room")
    await eventually(lambda: "alice" in b.remote_participants)

    gone = future()
    b.on("participant_disconnected", lambda p: resolve(gone, p.identity))
    await a.disconnect()
    assert await asyncio.wait_for(gone, 5) == "alice"
    await eventually(lambda: set(server.rooms["leave-room"].participants) == {"bob"})

    c = await join(server, rooms, "carol", "leave-room")
    kicked = future()
    c.on("disconnected", lambda reason: resolve(kicked, reason))
    await server.close_room("leave-room")
    await asyncio.wait_for(kicked, 5)
    assert "leave-room" not in server.rooms and "leave-room" in server.closed_rooms


# -- agents ----------------------------------------------------------------

async def start_worker(server: LoopbackLiveKitServer, agent_name: str, *, full: bool = False):
    env = dict(
        os.environ,
        LIVEKIT_URL=server.url,
        LIVEKIT_API_KEY=server.api_key,
        LIVEKIT_API_SECRET=server.api_secret,
        TEST_AGENT_NAME=agent_name,
        TEST_AGENT_FULL="1" if full else "0",
        TEST_AGENT_LOG="WARNING",
    )
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.livekit_server_tests.agent_worker_entry",
        cwd=str(REPO_ROOT), env=env,
    )


async def stop_worker(proc) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_agent_worker_dispatch(server: LoopbackLiveKitServer, rooms) -> None:
    proc = await start_worker(server, "test-agent")
    try:
        worker = await server.wait_for_worker("test-agent", available=True, timeout=60)  # a loaded machine imports livekit-agents slowly
        assert worker.version

        human = await join(server, rooms, "human", "agent-room")
        ready = future()
        text = future()
        left = future()
        human.on("participant_attributes_changed",
                 lambda attrs, p: "test.agent" in attrs and resolve(ready, p))
        human.on("participant_disconnected", lambda p: resolve(left, p.identity))

        def _on_text(reader: rtc.TextStreamReader, identity: str) -> None:
            async def _read() -> None:
                resolve(text, (identity, await reader.read_all()))
            asyncio.ensure_future(_read())

        human.register_text_stream_handler("test.agent", _on_text)

        dispatch = await server.create_dispatch("agent-room", "test-agent", metadata="meta-1")
        assert dispatch.state == "assigned" and dispatch.job_id
        job = server.jobs[dispatch.job_id]
        assert job.worker_id == worker.id

        agent_p = await asyncio.wait_for(ready, 15)
        assert agent_p.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT
        assert agent_p.identity == job.participant_identity
        assert agent_p.attributes["test.job_metadata"] == "meta-1"
        assert agent_p.attributes["lk.agent.name"] == "test-agent"
        assert await asyncio.wait_for(text, 5) == (agent_p.identity, "hello from agent")

        assert await server.terminate_job(dispatch.job_id)
        assert await asyncio.wait_for(left, 10) == agent_p.identity
    finally:
        await stop_worker(proc)


async def test_full_worker_is_not_dispatched(server: LoopbackLiveKitServer) -> None:
    # a real worker whose load (1.0) exceeds its load_threshold (0.5) reports WS_FULL
    proc = await start_worker(server, "busy-agent", full=True)
    try:
        worker = await server.wait_for_worker("busy-agent", timeout=20)
        await eventually(lambda: server.workers[worker.id].status == agent_pb.WorkerStatus.WS_FULL, 10)
        assert not server.workers[worker.id].available
        d = await server.create_dispatch("busy-room", "busy-agent")
        assert d.state == "no_worker" and d.job_id is None
        assert (worker.id, "full") in d.skipped
        assert not server.jobs
    finally:
        await stop_worker(proc)


async def test_raw_worker_full_then_available(server: LoopbackLiveKitServer) -> None:
    token = api.AccessToken(server.api_key, server.api_secret) \
        .with_grants(api.VideoGrants(agent=True)).to_jwt()
    http = server.url.replace("ws://", "http://")
    async with aiohttp.ClientSession() as s:
        ws = await s.ws_connect(f"{http}/agent", headers={"Authorization": f"Bearer {token}"})

        async def send(msg: agent_pb.WorkerMessage) -> None:
            await ws.send_bytes(msg.SerializeToString())

        async def recv() -> agent_pb.ServerMessage:
            m = agent_pb.ServerMessage()
            m.ParseFromString(await asyncio.wait_for(ws.receive_bytes(), 5))
            return m

        await send(agent_pb.WorkerMessage(register=agent_pb.RegisterWorkerRequest(
            type=agent_pb.JobType.JT_ROOM, agent_name="raw-agent", version="test")))
        reg = await recv()
        wid = reg.register.worker_id
        assert wid in server.workers

        await send(agent_pb.WorkerMessage(ping=agent_pb.WorkerPing(timestamp=123)))
        assert (await recv()).pong.last_timestamp == 123

        await send(agent_pb.WorkerMessage(update_worker=agent_pb.UpdateWorkerStatus(
            status=agent_pb.WorkerStatus.WS_FULL, load=1.0)))
        await eventually(lambda: server.workers[wid].status == agent_pb.WorkerStatus.WS_FULL)

        d = await server.create_dispatch("raw-room", "raw-agent", metadata="m")
        assert d.state == "no_worker" and (wid, "full") in d.skipped
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ws.receive_bytes(), 0.5)

        # becoming available again retries the pending dispatch
        await send(agent_pb.WorkerMessage(update_worker=agent_pb.UpdateWorkerStatus(
            status=agent_pb.WorkerStatus.WS_AVAILABLE, load=0.1)))
        req = (await recv()).availability
        assert req.job.agent_name == "raw-agent" and req.job.room.name == "raw-room"
        assert req.job.metadata == "m" and req.job.dispatch_id == d.id
        await send(agent_pb.WorkerMessage(availability=agent_pb.AvailabilityResponse(
            job_id=req.job.id, available=True, participant_identity="raw-bot")))
        assignment = (await recv()).assignment
        assert assignment.job.id == req.job.id and assignment.url == server.url
        claims = api.TokenVerifier(server.api_key, server.api_secret).verify(assignment.token)
        assert claims.identity == "raw-bot" and claims.kind == "agent"
        assert claims.video is not None and claims.video.room == "raw-room"
        await eventually(lambda: server.dispatches[d.id].state == "assigned")

        await send(agent_pb.WorkerMessage(update_job=agent_pb.UpdateJobStatus(
            job_id=req.job.id, status=agent_pb.JobStatus.JS_RUNNING)))
        await eventually(lambda: server.jobs[req.job.id].status == agent_pb.JobStatus.JS_RUNNING)

        assert await server.terminate_job(req.job.id)
        assert (await recv()).termination.job_id == req.job.id
        await ws.close()
    await eventually(lambda: wid not in server.workers)


async def test_automatic_dispatch(server: LoopbackLiveKitServer, rooms) -> None:
    """Workers without agent_name get every new room; token room_config.agents dispatch by name."""
    from livekit.protocol.agent_dispatch import RoomAgentDispatch
    from livekit.protocol.room import RoomConfiguration

    token = api.AccessToken(server.api_key, server.api_secret) \
        .with_grants(api.VideoGrants(agent=True)).to_jwt()
    http = server.url.replace("ws://", "http://")
    async with aiohttp.ClientSession() as s:
        sockets = {}
        for name in ("", "tok-agent"):
            ws = await s.ws_connect(f"{http}/agent", headers={"Authorization": f"Bearer {token}"})
            await ws.send_bytes(agent_pb.WorkerMessage(register=agent_pb.RegisterWorkerRequest(
                type=agent_pb.JobType.JT_ROOM, agent_name=name)).SerializeToString())
            await asyncio.wait_for(ws.receive_bytes(), 5)
            sockets[name] = ws

        async def availability(ws) -> agent_pb.AvailabilityRequest:
            m = agent_pb.ServerMessage()
            m.ParseFromString(await asyncio.wait_for(ws.receive_bytes(), 10))
            assert m.WhichOneof("message") == "availability"
            return m.availability

        await join(server, rooms, "u1", "auto-room")
        req = await availability(sockets[""])
        assert req.job.room.name == "auto-room" and req.job.agent_name == ""
        await sockets[""].send_bytes(agent_pb.WorkerMessage(availability=agent_pb.AvailabilityResponse(
            job_id=req.job.id, available=False)).SerializeToString())
        await eventually(lambda: any(
            d.room == "auto-room" and d.state == "no_worker" for d in server.dispatches.values()))

        cfg = RoomConfiguration(agents=[RoomAgentDispatch(agent_name="tok-agent", metadata="md")])
        tok = api.AccessToken(server.api_key, server.api_secret).with_identity("u2") \
            .with_grants(api.VideoGrants(room_join=True, room="tok-room")) \
            .with_room_config(cfg).to_jwt()
        r = rtc.Room()
        rooms.append(r)
        await asyncio.wait_for(r.connect(server.url, tok), 15)
        req = await availability(sockets["tok-agent"])
        assert req.job.agent_name == "tok-agent" and req.job.metadata == "md"
        assert req.job.room.name == "tok-room"
        for ws in sockets.values():
            await ws.close()


async def test_cli_prints_url() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devtools.livekit_server", "--port", "0", "--print-url",
        cwd=str(REPO_ROOT), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "LIVEKIT_API_KEY": "k1", "LIVEKIT_API_SECRET": "s1"},  # never in argv
    )
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
        assert url.startswith("ws://")
        tok = api.AccessToken("k1", "s1").with_identity("u") \
            .with_grants(api.VideoGrants(room_join=True, room="r")).to_jwt()
        async with aiohttp.ClientSession() as s:
            resp = await s.get(url.replace("ws://", "http://") + "/rtc/validate",
                               params={"access_token": tok})
            assert resp.status == 200
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
