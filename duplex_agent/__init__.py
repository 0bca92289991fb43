"""duplex-agent: a LiveKit/WebRTC voice-agent worker for full-duplex speech models.

The repository's folders install under this one name: ``duplex_agent.agent``
(runtime, protocol, session runner, app), ``duplex_agent.plugins`` (the model
contract, engines and models), ``duplex_agent.webrtc`` (transports) and
``duplex_agent.frontend`` (the page).
"""

__version__ = "0.1.0"
