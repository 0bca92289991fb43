"""Our realtime endpoint with the scripted model, as a separate process a test can kill.

Run: python -m tests.remote.server_process PORT [RESUME_GRACE_S]  (prints "ready PORT" once it listens
on 127.0.0.1:PORT, the system's pick for port 0; without a grace its sessions are not resumable)
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.contract import EncodeAudio
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

#: A reply long enough to kill the server in the middle of it (60 words, 50 ms apart).
REPLY = " ".join(f"word{i}" for i in range(60))


class StoryPlugin(ScriptedPlugin):
    """The scripted model telling ``REPLY`` at that pace, for ``serve --plugin tests.remote.server_process.StoryPlugin``."""

    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio, Script(reply=REPLY, word_delay_s=0.05))


async def main(port: int, resume_grace_s: float) -> None:
    plugin = StoryPlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    # By default not resumable: a killed process keeps nothing to resume, and the client must not wait for one.
    runner = web.AppRunner(build_app(backend, Settings(resume_grace_s=resume_grace_s), with_webrtc=False))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", runner.addresses[0][1], flush=True)  # the port bound (the system's pick for port 0)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
