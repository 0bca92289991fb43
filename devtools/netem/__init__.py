"""A network you can break: a caller's and a worker's network namespace joined only
through a userspace forwarder that drops, delays and reorders their UDP."""

from devtools.netem.forwarder import TO_CALLER, TO_WORKER, Forwarder
from devtools.netem.impairments import CLEAN, DirectionCounts, GilbertElliott, Impairment
from devtools.netem.link import ImpairedLink, remove_stale_namespaces
from devtools.netem.namespaces import NamespaceUnavailable, socket_in, unavailable_reason

__all__ = ["CLEAN", "TO_CALLER", "TO_WORKER", "DirectionCounts", "Forwarder", "GilbertElliott", "ImpairedLink",
           "Impairment", "NamespaceUnavailable", "remove_stale_namespaces", "socket_in", "unavailable_reason"]
