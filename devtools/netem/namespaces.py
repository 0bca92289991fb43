"""Network namespaces and TUN devices, through ``ip`` and libc.

A namespace is made with ``ip netns add`` (so ``ip netns exec NAME ...`` runs
programs in it). A TUN device is opened inside a namespace by a short-lived
thread that ``setns()``-es into it (only that thread moves; Python 3.11 has no
``os.setns``): the device is created in the namespace and the returned fd stays
bound to it after the thread exits. Closing the fd removes the device.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import threading

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
NETNS_DIR = "/var/run/netns"


class NamespaceUnavailable(RuntimeError):
    """Namespaces or TUN devices cannot be made here (the reason says why)."""


def unavailable_reason() -> str | None:
    """Why namespaces with TUN devices cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing"
    return None


def ip(*args: str) -> None:
    """Run ``ip ARGS``; a failure raises with ip's own message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NamespaceUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


def namespaces() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def add_namespace(name: str) -> None:
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Remove a namespace (its processes must be gone for its devices to go); a missing one is fine."""
    if name in namespaces():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _inside(namespace: str, make):  # noqa: ANN001, ANN202
    """``make()`` run on a short-lived thread moved into ``namespace``; its result (an fd or a
    socket made there stays bound to that namespace)."""
    result: list[object] = []

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            ns_fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
            try:
                if libc.setns(ns_fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {namespace}")
            finally:
                os.close(ns_fd)
            result.append(make())
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=run, name=f"setns-{namespace}")
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise NamespaceUnavailable(f"in {namespace}: {result[0]}") from result[0]
    return result[0]


def open_tun(namespace: str, device: str) -> int:
    """Create TUN ``device`` (IPv4 packets, no extra header) inside ``namespace``; its fd."""

    def make() -> int:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", device.encode(), IFF_TUN | IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
        return fd

    return _inside(namespace, make)


def socket_in(namespace: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
    """An IPv4 socket of ``namespace``'s network stack, usable from any thread of this process."""
    return _inside(namespace, lambda: socket.socket(socket.AF_INET, kind))
