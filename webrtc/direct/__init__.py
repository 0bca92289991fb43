"""Direct WebRTC with aiortc: signaling routes, peer sessions, tracks."""
