"""Which local address ICE offers: the host's own interface, never loopback.

aioice gathers host candidates on every interface and has no per-connection
setting for it, so ``candidates_on`` narrows its address lookup for gathering
done inside the ``with`` block (a context variable: other connections in the
process keep the default behaviour). This is the one place that patches aioice
(the version checked is in ``webrtc.private_internals``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import aioice.ice
import ifaddr

_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("ice_host_address", default=None)
_default_host_addresses = aioice.ice.get_host_addresses


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    address = _ADDRESS.get()
    if address is None:
        return _default_host_addresses(use_ipv4, use_ipv6)
    return [address]


@contextlib.contextmanager
def candidates_on(address: str) -> Iterator[None]:
    """ICE gathering started in this block offers only ``address``."""
    aioice.ice.get_host_addresses = _host_addresses
    token = _ADDRESS.set(address)
    try:
        yield
    finally:
        _ADDRESS.reset(token)


def interface_ipv4() -> str:
    """The first IPv4 address of a non-loopback interface (ValueError when there is none)."""
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                return ip.ip
    raise ValueError("no non-loopback IPv4 interface")
