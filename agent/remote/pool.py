"""Several remote backends behind one worker: where each new conversation goes.

``--backend`` names one or more duplex servers (``BackendList``). Each new
conversation goes to the backend with the most free sessions, ties broken by the
lowest round trip of its health probe. Free sessions are what this worker may
still open there (``--max-sessions`` per backend) capped by what the server says:
our ``/healthz``, vLLM-Omni's ``/health`` (a dead engine takes none), refusals.
A backend that refuses or fails is cooled down, 1 s doubling to 30 s while it
keeps failing, and skipped meanwhile. A backend that was down when the pool
started is started later, from the pool's own loop, once its cooldown is over.

Conversations come back as ``FailoverConversation``s: when theirs is lost they
move to another backend (see ``agent.remote.failover``).

Thread safety: a LiveKit worker opens conversations from its jobs' threads, so
the members' placement state sits behind one lock; the members themselves
(``RemoteBackend``) are thread-safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from duplex_agent.agent import metrics
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteConversation
from duplex_agent.agent.remote.failover import FailoverConversation
from duplex_agent.agent.session.ports import BUSY_CODES, AdmissionError, DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities

log = logging.getLogger("duplex_agent.remote")

#: First cooldown of a backend that refused or failed; it doubles per failure in a row, up to the cap.
COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 30.0
#: How often the pool's own loop starts the backends that were down, and retires removed ones.
_MAINTAIN_INTERVAL_S = 0.5


class BackendList:
    """``--backend``: URLs separated by commas, or ``@FILE`` (one URL per line, ``#`` comments), re-read each time."""

    def __init__(self, spec: str) -> None:
        self.spec = spec.strip()

    @property
    def file(self) -> Path | None:
        return Path(self.spec[1:]) if self.spec.startswith("@") else None

    def urls(self) -> list[str]:
        """The URLs in order, each once; a file that cannot be read raises OSError."""
        text = self.file.read_text() if self.file is not None else self.spec.replace(",", "\n")
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return list(dict.fromkeys(line for line in lines if line))


@dataclass(slots=True, eq=False)
class Member:
    backend: RemoteBackend
    #: The URL as the list gives it.
    spec: str
    failures: int = 0
    cool_until: float = 0.0
    removed: bool = False
    starting: bool = False

    @property
    def url(self) -> str:
        return str(self.backend.url.with_query(None))

    def cooling(self, now: float) -> bool:
        return now < self.cool_until

    def free_sessions(self, now: float) -> int:
        """Sessions a new conversation may still get here (0 while cooling down or removed)."""
        if self.removed or self.cooling(now):
            return 0
        free = self.backend.max_sessions - self.backend.active_sessions
        server = self.backend.server_free_sessions
        return max(0, free if server is None else min(free, server))

    def rtt_s(self) -> float:
        rtt = self.backend.capacity.rtt_s
        return math.inf if rtt is None else rtt


class BackendPool(DuplexBackend):
    """A ``DuplexBackend`` over several ``RemoteBackend``s; conversations that outlive the one they started on."""

    def __init__(self, backends: BackendList, make: Callable[[str], RemoteBackend], *,
                 lost_grace_s: float = 10.0) -> None:
        """``make``: a ``RemoteBackend`` for one URL. ``lost_grace_s``: how long a conversation with no
        backend left keeps looking for one before it ends (``backend_lost``)."""
        self.backends = backends
        self.lost_grace_s = lost_grace_s
        self._make = make
        self._lock = threading.Lock()
        self._members: list[Member] = []
        self._admitting = True
        self._capabilities: DuplexCapabilities | None = None
        self._maintain: asyncio.Task[None] | None = None
        self._reloading: asyncio.Task[None] | None = None
        self._hup_loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ----

    async def start(self) -> None:
        """Start every backend (a probe session each); raises the first refusal when none starts."""
        self._add(self.backends.urls())
        with self._lock:
            members = list(self._members)
        results = await asyncio.gather(*(self._start_member(m) for m in members), return_exceptions=True)
        if not any(m.backend.started for m in members):
            errors = [r for r in results if isinstance(r, BaseException)]
            raise errors[0] if errors else AdmissionError("no backend given", code="backend_unavailable")
        self._maintain = asyncio.create_task(self._maintain_members(), name="backend-pool-maintain")
        if self.backends.file is not None:
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_soon)
                self._hup_loop = asyncio.get_running_loop()
            except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no SIGHUP here
                log.warning("cannot re-read %s on SIGHUP from this thread", self.backends.file)

    async def close(self) -> None:
        with self._lock:
            self._admitting = False
            members = list(self._members)
        if self._hup_loop is not None:
            self._hup_loop.remove_signal_handler(signal.SIGHUP)
            self._hup_loop = None
        for task in (self._maintain, self._reloading):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*(m.backend.close() for m in members), return_exceptions=True)

    def reload_soon(self) -> None:
        """SIGHUP: re-read the backend file (from the loop the pool started in)."""
        if self._reloading is None or self._reloading.done():
            self._reloading = asyncio.create_task(self.reload(), name="backend-pool-reload")

    async def reload(self) -> None:
        """Take the backend list as it is now: new URLs join, missing ones take no new conversations."""
        try:
            urls = self.backends.urls()
        except OSError as exc:
            log.error("cannot re-read the backend list %s: %s; keeping the current one", self.backends.spec, exc)
            return
        with self._lock:
            for member in self._members:
                if member.spec not in urls:
                    member.removed = True
                    member.backend.stop_admitting()
        self._add(urls)
        log.info("backends now: %s", ", ".join(self.urls))

    def _add(self, urls: list[str]) -> None:
        with self._lock:
            known = {m.spec for m in self._members if not m.removed}
            for url in urls:
                if url in known:
                    continue
                member = Member(self._make(url), url)
                self._members.append(member)
                self._track(member)

    @staticmethod
    def _track(member: Member) -> None:
        label = member.url
        metrics.BACKEND_SESSIONS.labels(label).set_function(lambda: member.backend.active_sessions)
        metrics.BACKEND_FREE.labels(label).set_function(
            lambda: -1 if member.backend.server_free_sessions is None else member.backend.server_free_sessions)
        metrics.BACKEND_RTT_MS.labels(label).set_function(
            lambda: 1000.0 * member.backend.capacity.rtt_s if member.backend.capacity.rtt_s is not None else -1)
        metrics.BACKEND_REFUSALS.labels(label)

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return [m.url for m in self._members if not m.removed]

    @property
    def members(self) -> list[Member]:
        with self._lock:
            return list(self._members)

    async def _start_member(self, member: Member) -> None:
        member.starting = True
        try:
            await member.backend.start()
        except AdmissionError as exc:
            log.warning("backend %s did not start: %s", member.url, exc)
            self._failed(member, exc.code)
            raise
        finally:
            member.starting = False
        self._succeeded(member)
        if self._capabilities is None:
            self._capabilities = member.backend.capabilities

    async def _maintain_members(self) -> None:
        """Start the backends that were down (once cooled down); close removed ones once they are idle."""
        while True:
            await asyncio.sleep(_MAINTAIN_INTERVAL_S)
            now = time.monotonic()
            with self._lock:
                members = list(self._members)
            for member in members:
                if member.removed:
                    if member.backend.active_sessions == 0:
                        with self._lock:
                            self._members.remove(member)
                        await member.backend.close()
                        for gauge in (metrics.BACKEND_SESSIONS, metrics.BACKEND_FREE, metrics.BACKEND_RTT_MS):
                            gauge.remove(member.url)
                elif not member.backend.started and not member.starting and not member.cooling(now):
                    await asyncio.gather(self._start_member(member), return_exceptions=True)
                elif member.backend.started:
                    member.backend.watch_capacity()  # a backend first reached by an open has no probe yet

    # ---- placement ----

    @property
    def capabilities(self) -> DuplexCapabilities:
        if self._capabilities is None:
            raise RuntimeError("BackendPool.capabilities is known after `await pool.start()`")
        with self._lock:
            total = sum(m.backend.max_sessions for m in self._members if not m.removed)
        return dataclasses.replace(self._capabilities, max_sessions=total)

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return sum(m.backend.active_sessions for m in self._members)

    @property
    def server_free_sessions(self) -> int:
        """Sessions the pool will still take, over every backend; a LiveKit worker's load uses it."""
        now = time.monotonic()
        with self._lock:
            return sum(m.free_sessions(now) for m in self._members)

    def stop_admitting(self) -> None:
        with self._lock:
            self._admitting = False
            members = list(self._members)
        for member in members:
            member.backend.stop_admitting()

    async def open(self) -> FailoverConversation:
        member, conversation = await self.place()
        return FailoverConversation(self, member, conversation, lost_grace_s=self.lost_grace_s)

    def candidates(self) -> list[Member]:
        """Members with room, most free sessions first, then the shortest round trip."""
        now = time.monotonic()
        with self._lock:
            if not self._admitting:
                raise AdmissionError("this worker is shutting down", code="shutting_down")
            scored = [(m.free_sessions(now), m.rtt_s(), n, m) for n, m in enumerate(self._members)]
        scored = [entry for entry in scored if entry[0] > 0]
        scored.sort(key=lambda entry: (-entry[0], entry[1], entry[2]))
        return [entry[3] for entry in scored]

    async def place(self) -> tuple[Member, RemoteConversation]:
        """A conversation on the best backend that takes one; AdmissionError when none does."""
        refused = False
        tried = 0
        for member in self.candidates():
            tried += 1
            try:
                conversation = await member.backend.open()
            except AdmissionError as exc:
                if exc.code == "shutting_down" and member.removed:
                    continue
                if exc.code == "shutting_down":
                    raise
                local_full = member.backend.active_sessions >= member.backend.max_sessions
                refused = refused or exc.code in BUSY_CODES
                if not local_full:
                    self._failed(member, exc.code)
                log.info("backend %s: %s", member.url, exc)
                continue
            self._succeeded(member)
            if self._capabilities is None:
                self._capabilities = member.backend.capabilities
            return member, conversation
        if refused or not tried:
            raise AdmissionError(f"every backend is full ({len(self.urls)} known); try again later",
                                 code="resource_exhausted")
        raise AdmissionError(f"no backend can be reached ({len(self.urls)} known)", code="backend_unavailable")

    # ---- health ----

    def lost(self, member: Member, reason: str | None = None) -> None:
        """A conversation on ``member`` was lost with its host (``reason``: a ``LostReason``)."""
        self._failed(member, f"backend_lost_{reason}" if reason else "backend_lost")

    def _failed(self, member: Member, code: str) -> None:
        if code in BUSY_CODES:
            metrics.BACKEND_REFUSALS.labels(member.url).inc()
        else:
            metrics.BACKEND_FAILURES.labels(member.url, code).inc()
        with self._lock:
            member.failures += 1
            cooldown = min(MAX_COOLDOWN_S, COOLDOWN_S * 2 ** (member.failures - 1))
            member.cool_until = max(member.cool_until, time.monotonic() + cooldown)
        log.info("backend %s cooled down for %g s (%s; %d in a row)", member.url, cooldown, code, member.failures)

    def _succeeded(self, member: Member) -> None:
        with self._lock:
            member.failures = 0
            member.cool_until = 0.0
