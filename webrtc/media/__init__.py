"""The call audio path both transports share: resampling, playout, edge onset, latency figures."""
