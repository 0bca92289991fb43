"""The remote backend: conversations on a vLLM-Omni duplex server over its realtime websocket."""
