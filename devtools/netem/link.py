"""Two network namespaces, a caller's and a worker's, joined only through the Forwarder.

    caller namespace                                   worker namespace
    10.203.0.1/30 on TUN  <-- Forwarder (this process) -->  TUN 10.203.0.5/30

Each namespace has loopback up and a route to the other side's /30 through its
TUN. The addresses exist only inside these namespaces, so several links (even of
several processes) can use the same ones. Programs run inside with
``ip netns exec NAME ...`` (``link.exec_prefix("worker")``).

Everything is removed on exit, whatever ended the block: processes still running
in the namespaces (started there by the user of the link) are terminated, the
forwarder stops, the TUN devices close (which removes them) and the namespaces are
deleted. Namespaces left by a process that died without cleaning up are deleted
the next time a link is made.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time

from devtools.netem import namespaces as ns
from devtools.netem.forwarder import TO_CALLER, TO_WORKER, Forwarder
from devtools.netem.impairments import CLEAN, DirectionCounts, Impairment

PREFIX = "dxnetem-"
CALLER_ADDRESS, WORKER_ADDRESS = "10.203.0.1", "10.203.0.5"
_SUBNETS = {"caller": ("10.203.0.1/30", "10.203.0.4/30"), "worker": ("10.203.0.5/30", "10.203.0.0/30")}
_DEVICE = "netem0"
_serial = itertools.count()


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces of this prefix whose creating process is gone; their names."""
    removed = []
    for name in ns.namespaces():
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
            os.kill(pid, 0)
            continue  # its owner is alive
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        _end_processes_in(name)
        ns.delete_namespace(name)
        removed.append(name)
    return removed


def _pids_in(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _end_processes_in(namespace: str, grace_s: float = 5.0) -> None:
    pids = _pids_in(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = _pids_in(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class ImpairedLink:
    """``with ImpairedLink(to_worker=..., to_caller=..., seed=...) as link:`` two namespaces
    and the forwarder between them, impairing UDP each way as configured."""

    def __init__(self, to_worker: Impairment = CLEAN, to_caller: Impairment = CLEAN, seed: int = 0) -> None:
        reason = ns.unavailable_reason()
        if reason:
            raise ns.NamespaceUnavailable(reason)
        base = f"{PREFIX}{os.getpid()}-{next(_serial)}"
        self.namespace = {"caller": f"{base}-caller", "worker": f"{base}-worker"}
        self.address = {"caller": CALLER_ADDRESS, "worker": WORKER_ADDRESS}
        self._impairments = (to_worker, to_caller)
        self._seed = seed
        self._fds: dict[str, int] = {}
        self.forwarder: Forwarder | None = None

    def __enter__(self) -> ImpairedLink:
        try:
            remove_stale_namespaces()
            for side, name in self.namespace.items():
                ns.add_namespace(name)
                self._fds[side] = ns.open_tun(name, _DEVICE)
                own, other = _SUBNETS[side]
                ns.ip("-n", name, "addr", "add", own, "dev", _DEVICE)
                ns.ip("-n", name, "link", "set", _DEVICE, "up")
                ns.ip("-n", name, "route", "add", other, "dev", _DEVICE)
            self.forwarder = Forwarder(self._fds["caller"], self._fds["worker"], *self._impairments, seed=self._seed)
            self.forwarder.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec_prefix(self, side: str) -> list[str]:
        """The command prefix that runs a program inside ``side``'s namespace ("caller" or "worker")."""
        return ["ip", "netns", "exec", self.namespace[side]]

    def counts(self) -> dict[str, DirectionCounts]:
        """What the forwarder really did to each direction's UDP so far (``TO_WORKER``, ``TO_CALLER``)."""
        assert self.forwarder is not None
        return self.forwarder.counts()

    def reset_counts(self) -> None:
        assert self.forwarder is not None
        self.forwarder.reset_counts()

    def impair(self, to_worker: Impairment = CLEAN, to_caller: Impairment = CLEAN) -> None:
        """From now on, impair each direction so (the counts carry on)."""
        assert self.forwarder is not None
        self.forwarder.set_impairment(TO_WORKER, to_worker)
        self.forwarder.set_impairment(TO_CALLER, to_caller)

    def blackout(self, seconds: float) -> None:
        """Drop every UDP packet both ways for the next ``seconds``."""
        assert self.forwarder is not None
        self.forwarder.blackout(seconds)

    def blackout_drop_span(self, direction: str) -> float:
        """Seconds from the first to the last UDP packet the last blackout dropped in ``direction``."""
        assert self.forwarder is not None
        return self.forwarder.blackout_drop_span(direction)

    def wait_flowing(self, timeout: float) -> bool:
        """Wait until UDP has gone through both ways since the last blackout ended; whether it has."""
        assert self.forwarder is not None
        deadline = time.monotonic() + timeout
        while not self.forwarder.flowing_again():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        for name in self.namespace.values():
            if name in ns.namespaces():
                _end_processes_in(name)
        if self.forwarder is not None:
            self.forwarder.stop()
            self.forwarder = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for name in self.namespace.values():
            ns.delete_namespace(name)
