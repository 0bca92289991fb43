"""The caller's receive buffer modes on direct WebRTC peers (aiortc-free: the CLI's flags read it).

``adaptive``: ours (jitter-following delay, Opus in-band FEC, concealment), the default;
``aiortc``: aiortc's own jitter buffer, to compare.
"""

RECEIVE_BUFFER_MODES = ("adaptive", "aiortc")
DEFAULT_RECEIVE_BUFFER = RECEIVE_BUFFER_MODES[0]
