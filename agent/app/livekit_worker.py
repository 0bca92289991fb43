"""duplex-agent as a LiveKit worker (``duplex-agent start`` / ``dev``).

Built on livekit-agents' ``AgentServer``: it registers with the LiveKit server
under an agent name (explicit dispatch), takes jobs, and reports its load as
its own session count against its capacity, so a full worker is not
dispatched to. Jobs run as threads of this process (each with its own event loop), so the
models load once and every room shares them and one session count; each job
serves its room's callers through ``webrtc.livekit_room.LiveKitRoomCall``.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from livekit import agents

from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.session.ports import DuplexBackend
from duplex_agent.webrtc.livekit.room import LiveKitRoomCall, preferred_caller

log = logging.getLogger("duplex_agent.livekit")


class CredentialsError(ValueError):
    pass


def check_credentials(settings: Settings) -> None:
    missing = [name for name, value in (("LIVEKIT_URL (--livekit-url)", settings.livekit_url),
                                        ("LIVEKIT_API_KEY (--livekit-api-key)", settings.livekit_api_key),
                                        ("LIVEKIT_API_SECRET (--livekit-api-secret)", settings.livekit_api_secret))
               if not value]
    if missing:
        raise CredentialsError("missing LiveKit credentials: " + ", ".join(missing))
    if not settings.livekit_url.startswith(("ws://", "wss://", "http://", "https://")):
        raise CredentialsError(f"LIVEKIT_URL must be a ws:// or wss:// URL, got {settings.livekit_url!r}")


def build_agent_server(settings: Settings, backend: DuplexBackend, *, dev: bool) -> agents.AgentServer:
    capacity = settings.max_sessions

    def load() -> float:
        return min(1.0, backend.active_sessions / capacity)

    server = agents.AgentServer(
        ws_url=settings.livekit_url,
        api_key=settings.livekit_api_key,
        api_secret=settings.livekit_api_secret,
        job_executor_type=agents.JobExecutorType.THREAD,
        load_fnc=load,
        load_threshold=1.0,  # full exactly when every session slot is taken
        # livekit-agents charges a job accepted but not yet running load_threshold / idle
        # runners: with one runner per slot that is one session, so calls arriving
        # together are all taken while slots remain.
        num_idle_processes=capacity,
        port=0,
        log_level="DEBUG" if dev else settings.log_level.upper(),
    )

    async def entrypoint(ctx: agents.JobContext) -> None:
        await ctx.connect(auto_subscribe=agents.AutoSubscribe.SUBSCRIBE_NONE)
        call = LiveKitRoomCall(ctx.room, backend, caller_identity=preferred_caller(ctx.job.metadata))
        log.info("job %s: room %s", ctx.job.id, ctx.room.name)
        await call.run()
        log.info("job %s ends after %d session(s)", ctx.job.id, call.sessions_served)
        ctx.shutdown("room closed")

    server.rtc_session(entrypoint, agent_name=settings.agent_name)
    return server


async def _serve(settings: Settings, *, dev: bool) -> None:
    from duplex_agent.agent.app.bootstrap import start_backend
    from duplex_agent.agent.app.server import build_app, start_http

    backend = await start_backend(settings)
    server = build_agent_server(settings, backend, dev=dev)
    page = None
    if dev:  # the page too, minting room tokens with this worker's credentials
        page = await start_http(build_app(backend, settings, mint_livekit_tokens=True), settings.host, settings.port)
        print(f"duplex-agent: the page is on http://{settings.host}:{settings.port}/ (LiveKit mode mints dev tokens)",
              flush=True)
    print(f"duplex-agent: registering with {settings.livekit_url} as agent {settings.agent_name!r} "
          f"(capacity {settings.max_sessions} sessions)", flush=True)
    try:
        await server.run(devmode=dev)
    finally:
        if page is not None:
            await page.cleanup()


def run_worker(settings: Settings, *, dev: bool) -> int:
    """Register and serve until interrupted; a clear message and exit 2 on bad configuration."""
    try:
        check_credentials(settings)
    except CredentialsError as exc:
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(settings, dev=dev))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # the SDK gave up after its retries
        print(f"duplex-agent: the LiveKit worker stopped: {exc}", file=sys.stderr)
        return 1
    return 0
