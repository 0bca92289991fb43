"""Transports: the direct aiortc peer, shared call audio (resampling, playout, edge barge-in)."""
