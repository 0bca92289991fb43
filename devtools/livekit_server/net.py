"""Network helpers: the machine's own (non-loopback) IPv4 address, loopback hosts, the signal URL."""

from __future__ import annotations

import ipaddress
import socket
import subprocess


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; False for a name or a wildcard."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def signal_url(host: str, port: int) -> str:
    """``ws://host:port``, an IPv6 address in brackets."""
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"


def interface_ipv4() -> str:
    """First non-loopback IPv4 address of this machine (aiortc ICE skips 127.0.0.1)."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=5
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                addr = parts[parts.index("inet") + 1].split("/")[0]
                if not addr.startswith("127."):
                    return addr
    except (OSError, subprocess.SubprocessError):
        pass
    # fallback: a connected UDP socket picks the outgoing interface; nothing is sent
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        addr = s.getsockname()[0]
    except OSError:
        addr = "127.0.0.1"
    finally:
        s.close()
    return addr
