"""The third-party internals this package leans on, and the one version of each package they were checked against.

Each package family's private uses live in one module, which names its version here:

- aiortc, ``webrtc.direct.aiortc_receiver``: ``RTCRtpReceiver``'s ``__decoder_queue``,
  ``__jitter_buffer`` and ``__started`` (our readers take the receiver's packets and frames).
- aioice, ``webrtc.direct.host_address``: ``aioice.ice.get_host_addresses``, replaced so
  that gathering inside ``candidates_on`` offers one address.
- aioice and aiortc, ``webrtc.direct.ice_consent``: ``Connection.query_consent`` (replaced on
  each of our connections: ``connect()`` starts it once ICE completes), ``Connection._nominated``,
  ``build_request`` and ``remote_password``, and each pair's ``protocol.transactions`` (a response
  goes to the entry of its transaction ID, by ``response_received(message, addr)``) and
  ``send_stun``; aiortc's ``RTCIceTransport._connection`` (``ice_connections``, which
  ``webrtc.direct.datagram_guard`` also uses to wrap ``Connection.data_received``, aioice's
  hand-off of non-STUN datagrams to aiortc). tests/webrtc/test_ice_consent.py and
  tests/webrtc/test_datagram_guard.py run them on real connections.
- livekit (the rtc SDK), ``webrtc.livekit.ffi_router`` and ``webrtc.livekit.ffi_audio``:
  ``FfiClient`` and its queue's lock and ``subscribe`` (wrapped: an unfiltered subscriber skips what the router took), ``livekit.rtc._proto``, ``livekit.rtc._utils.Queue``,
  ``AudioStream._ffi_queue``, ``AudioStream._loop``, ``Room._ffi_queue``, ``Room._loop``,
  ``Room._task``, ``Room._room_queue``, ``_ffi_handle`` of streams, sources, rooms and
  participants, ``AudioFrame._proto_info``; at interpreter exit ``FfiClient._instance``,
  ``FfiClient._dispose`` and the name of ``livekit.rtc._ffi_client.ffi_event_callback`` (found
  in the threads' frames); also ``agent.app.livekit_worker`` creates the ``FfiClient`` once on
  the main thread.
- livekit-agents, ``livekit_agents.agent_link`` and ``livekit_agents.backends``:
  ``JobContext._primary_agent_session`` (the job's AgentSession, to find ours),
  ``AgentSession._aec_warmup_duration_explicit`` and ``voice.agent_session._DEFAULT_AEC_WARMUP_DURATION``
  (to warn when the AEC warm-up is left at its default), and ``threading._register_atexit`` (the
  in-process engine stops before the executors' shutdown). Each is read through ``getattr`` with a
  default that is safe when it is gone: no session found (``attach`` still works), no warning,
  a plain ``atexit`` hook.

Outside the installed package, the loopback SFU under devtools/ keeps its own aiortc
seams (devtools/livekit_server/aiortc_seams.py), checked against the same aiortc.

pyproject.toml pins each package to the range of its checked version, and
tests/packaging/test_private_internals.py checks that the installed ones are these.
"""

from __future__ import annotations

#: package (its distribution name) -> the version its internals were checked against
CHECKED_VERSIONS: dict[str, str] = {
    "aiortc": "1.16.0",
    "aioice": "0.13.0",
    "livekit": "1.1.21",
    "livekit-agents": "1.8.9",
}
