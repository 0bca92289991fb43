"""duplex-agent as a LiveKit worker (``duplex-agent start`` / ``dev``).

Built on livekit-agents' ``AgentServer``: it registers with the LiveKit server
under an agent name (explicit dispatch), takes jobs, and reports its load as
the share of its session slots in use -- its live jobs, or fewer free sessions
on a remote backend that says it is (nearly) full -- so a full worker is not
dispatched to. Jobs run as threads of this process (each with its own event
loop), so the models load once and every room shares them; each job serves
its room's callers through ``webrtc.livekit.room.LiveKitRoomCall``.

Shutdown follows livekit-agents' own CLI: the first SIGTERM or SIGINT calls
``AgentServer.drain`` (the server is told the worker is full; job offers are
refused) and asks every call to finish after its current caller; live calls go
on up to ``drain_timeout``, then close with reason ``shutdown`` and leave their
rooms; ``AgentServer.aclose`` follows and the process exits 0. A second signal
exits at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from livekit import agents, api

from duplex_agent.agent import metrics
from duplex_agent.agent.app.collector import collect_after_call
from duplex_agent.agent.app.outbound_call import dial_out
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.app.shutdown import ShutdownSignals
from duplex_agent.agent.models.model_errors import MissingModelError, ModelStartError
from duplex_agent.agent.process_figures import watch_loop
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.ports import DuplexBackend
from duplex_agent.agent.telephony.dial_request import DialRequestError, dial_request_of
from duplex_agent.plugins.contract.loops import run_in_owner_loops
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.livekit.room import LiveKitRoomCall, preferred_caller
from duplex_agent.webrtc.livekit.sip_call_control import SipCallControl

if TYPE_CHECKING:
    from duplex_agent.agent.tools.toolbox import ToolBox

log = logging.getLogger("duplex_agent.livekit")
#: livekit-agents watches each job runner's event loop for blocking code: a heartbeat and a
#: watchdog thread per runner, each waking every fifth of the warn threshold (100 ms by
#: default: 20 ms). This worker keeps one idle runner per session slot, so with many slots those
#: wake-ups cost a share of a core before any call, for blocks this worker does not need to hear
#: of that soon. Unless the deployment sets it, blocks of 250 ms and more are reported.
LOOP_BLOCK_WARN_ENV = "LIVEKIT_AGENTS_LOOP_BLOCK_WARN_MS"
LOOP_BLOCK_WARN_MS = "250"
#: How long calls closed at the drain deadline get to say goodbye and leave their rooms.
_CLOSE_CALLS_TIMEOUT_S = 10.0
#: How long closing the agent server (and with it every job thread) may take after the drain.
_ACLOSE_TIMEOUT_S = 30.0


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


class LiveCalls:
    """The room calls this process runs, each on its job's thread and loop; read and driven from the main loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[LiveKitRoomCall, asyncio.AbstractEventLoop] = {}
        self._draining = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def add(self, call: LiveKitRoomCall) -> None:
        """Called in the job's loop, just before ``call.run()``."""
        with self._lock:
            self._calls[call] = asyncio.get_running_loop()
            if self._draining:  # offered before the drain began: serve whoever is there, then end
                call.finish_after_current()

    def remove(self, call: LiveKitRoomCall) -> None:
        with self._lock:
            self._calls.pop(call, None)

    def finish_after_current(self) -> None:
        with self._lock:
            self._draining = True
            for call, loop in self._calls.items():
                loop.call_soon_threadsafe(call.finish_after_current)

    async def close_all(self, reason: str) -> None:
        """Close every call in its own loop and wait (bounded) for them to end."""
        with self._lock:
            live = [(loop, functools.partial(call.close, reason)) for call, loop in self._calls.items()]
        if live:
            log.warning("drain timeout: closing %d live call(s)", len(live))
            await run_in_owner_loops(live, timeout_s=_CLOSE_CALLS_TIMEOUT_S)


def worker_load(backend: DuplexBackend, calls: LiveCalls, capacity: int, cpu_guard: CpuGuard | None = None) -> float:
    """The share of session slots in use: the local ones, or the remote backend's when it has fewer free;
    or, where it is higher, the machine's CPU against ``--max-cpu`` (1.0: full, LiveKit sends no job).

    A pool of backends (``--backend`` several times) reports the free sessions of all of them together.
    """
    free = capacity - max(len(calls), backend.active_sessions)
    # Only a remote backend (or pool) knows how full its servers are; None when it cannot tell.
    server_free = backend.server_free_sessions
    if server_free is not None:
        free = min(free, server_free)
    slots = 1.0 - free / capacity
    return min(1.0, max(0.0, slots, cpu_guard.load() if cpu_guard is not None else 0.0))


def build_agent_server(settings: Settings, backend: DuplexBackend, calls: LiveCalls, *,
                       dev: bool, tools: ToolBox | None = None, cpu_guard: CpuGuard | None = None) -> agents.AgentServer:
    os.environ.setdefault(LOOP_BLOCK_WARN_ENV, LOOP_BLOCK_WARN_MS)  # read as each job runner starts
    capacity = settings.max_sessions
    server = agents.AgentServer(
        ws_url=settings.livekit_url,
        api_key=settings.livekit_api_key,
        api_secret=settings.livekit_api_secret,
        job_executor_type=agents.JobExecutorType.THREAD,
        load_fnc=lambda: worker_load(backend, calls, capacity, cpu_guard),
        load_threshold=1.0,  # full exactly when every session slot is taken (or the CPU is at --max-cpu)
        # livekit-agents charges a job accepted but not yet running load_threshold / idle
        # runners: with one runner per slot that is one session, so calls arriving
        # together are all taken while slots remain.
        num_idle_processes=capacity,
        drain_timeout=int(settings.drain_timeout),
        host=settings.host,  # livekit-agents' HTTP server (health, worker info): on our address, not every one
        port=0,
        log_level="DEBUG" if dev else settings.log_level.upper(),
    )

    async def entrypoint(ctx: agents.JobContext) -> None:
        try:
            dial = dial_request_of(ctx.job.metadata)  # an outbound call to place, from the job's metadata
        except DialRequestError as exc:
            metrics.DIAL_OUTCOMES.labels("invalid_request").inc()
            log.error("job %s: cannot place the call: %s", ctx.job.id, exc)
            ctx.shutdown("invalid dial request")
            return
        watch_loop()  # a job's own loop: its tasks on /metrics beside the main loop's
        await ctx.connect(auto_subscribe=agents.AutoSubscribe.SUBSCRIBE_NONE)
        FfiRouter.shared().own_room(ctx.room)  # this job's loop wakes for its own room's events only
        # The room's API: how an outbound call is placed, and how a hang-up or a transfer moves the caller.
        lkapi = api.LiveKitAPI(settings.livekit_url, settings.livekit_api_key, settings.livekit_api_secret) \
            if dial is not None else None
        room_api = lkapi if lkapi is not None else (ctx.api if tools is not None else None)
        call = LiveKitRoomCall(
            ctx.room, backend, tools=tools, room_api=room_api, control_type=SipCallControl,
            caller_identity=dial.participant_identity if dial is not None else preferred_caller(ctx.job.metadata),
            only_caller=dial is not None)
        log.info("job %s: room %s", ctx.job.id, ctx.room.name)
        calls.add(call)
        dialing = asyncio.create_task(dial_out(lkapi, call, dial), name="livekit-dial-out") \
            if lkapi is not None and dial is not None else None
        try:
            await call.run()
        finally:
            calls.remove(call)
            if dialing is not None:
                dialing.cancel()
                await asyncio.gather(dialing, return_exceptions=True)
            if lkapi is not None:
                await lkapi.aclose()
        log.info("job %s ends after %d session(s)", ctx.job.id, call.sessions_served)
        ctx.shutdown("room closed")  # the framework leaves the room
        collect_after_call()  # this call's room goes at the next call's end; earlier ones now

    server.rtc_session(entrypoint, agent_name=settings.agent_name)
    return server


def _start_livekit_ffi() -> None:
    """Create livekit.rtc's native client now, on the main thread, before any job runs.

    The SDK creates it lazily and unguarded: two job threads that touch it first at the
    same moment each make one, and the rooms of one never hear from it (a connect stalls
    until the native side panics and SIGTERMs the process; a disconnect never returns).
    """
    from livekit.rtc._ffi_client import FfiClient

    assert FfiClient.instance is not None


async def _drain(server: agents.AgentServer, calls: LiveCalls, settings: Settings, signal_name: str) -> None:
    """livekit-agents' drain (no new jobs, the server told we are full), live calls finishing, then closed."""
    log.warning("%s: draining; live calls have up to %g s (a second signal exits at once)",
                signal_name, settings.drain_timeout)
    calls.finish_after_current()
    try:
        # livekit-agents types the timeout as int; it hands it to asyncio.wait_for, which takes float seconds.
        await server.drain(timeout=settings.drain_timeout)  # type: ignore[arg-type]
    except TimeoutError:
        await calls.close_all("shutdown")
    try:
        await asyncio.wait_for(server.aclose(), _ACLOSE_TIMEOUT_S)
    except TimeoutError:
        # A job thread that never ends (livekit.rtc can lose a room's disconnect callback) would
        # keep the process alive for good: say so and leave with a failure status instead.
        log.error("a job did not end within %g s of closing the worker; exiting without it", _ACLOSE_TIMEOUT_S)
        logging.shutdown()
        os._exit(1)


async def _serve(settings: Settings, cpu_guard: CpuGuard, *, dev: bool) -> None:
    from duplex_agent.agent.app.heap import keep_the_heap
    from duplex_agent.agent.app.server import build_app, build_metrics_app, start_http
    from duplex_agent.agent.app.tools_setup import start_serving_backend

    signals = ShutdownSignals()
    signals.install()
    _start_livekit_ffi()
    backend, tools = await start_serving_backend(settings)
    cpu_guard.start()
    calls = LiveCalls()
    server = build_agent_server(settings, backend, calls, dev=dev, tools=tools, cpu_guard=cpu_guard)
    page = None
    if not dev and settings.metrics_port:  # /metrics and /healthz alone, for a worker that serves no page
        page = await start_http(build_metrics_app(backend), settings.metrics_host, settings.metrics_port)
    if dev:  # the page too, minting room tokens with this worker's credentials
        page = await start_http(build_app(backend, settings, mint_livekit_tokens=True, tools=tools,
                                          cpu_guard=cpu_guard), settings.host, settings.port)
        scheme = "https" if settings.tls_enabled else "http"
        print(f"duplex-agent: the page is on {scheme}://{settings.host}:{settings.port}/ "
              "(LiveKit mode mints dev tokens)", flush=True)
    print(f"duplex-agent: registering with {settings.livekit_url} as agent {settings.agent_name!r} "
          f"(capacity {settings.max_sessions} sessions)", flush=True)
    heap = keep_the_heap()
    running = asyncio.create_task(server.run(devmode=dev), name="livekit-agent-server")
    stop = asyncio.create_task(signals.requested.wait(), name="shutdown-signal")
    try:
        await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
        if stop.done():
            await _drain(server, calls, settings, signals.signal_name)
        await running  # returns once aclose() has run; raises when the SDK gave up
    finally:
        stop.cancel()
        heap.cancel()
        cpu_guard.stop()
        await server.aclose()  # a no-op after a drain
        await backend.close()
        if page is not None:
            await page.cleanup()
    log.info("the LiveKit worker has stopped")


def run_worker(settings: Settings, *, dev: bool) -> int:
    """Register and serve until a signal drains it; a clear message and exit 2 on bad configuration."""
    try:
        check_credentials(settings)
        cpu_guard = CpuGuard(settings.max_cpu)
    except ValueError as exc:  # CredentialsError among them
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(settings, cpu_guard, dev=dev))
    except (MissingModelError, ModelStartError):
        raise  # the model or backend cannot start as configured: the CLI's one line and exit 2, as for serve
    except Exception as exc:  # the SDK gave up after its retries
        print(f"duplex-agent: the LiveKit worker stopped: {exc}", file=sys.stderr)
        return 1
    return 0
