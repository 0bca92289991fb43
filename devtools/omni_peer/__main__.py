"""``python -m devtools.omni_peer --port P``: vLLM-Omni 0.30.0's duplex server on loopback, scripted stages.

Run it with ``.venv-omni/bin/python`` (``make omni-venv``). It serves vLLM-Omni's own FastAPI
routes (``/v1/realtime?duplex=1``, ``/health``) with a real ``DuplexOmni`` on the Qwen3-Omni
duplex pipeline; only the stage engine cores are scripted (``orchestrator_seams``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile

from devtools.omni_peer import native_stubs

LOG = logging.getLogger("omni_peer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools.omni_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--check", action="store_true",
                        help="import the serving path and exit (the venv is complete when this exits 0)")
    parser.add_argument("--sample-rate", type=int, default=24000, choices=(16000, 24000),
                        help="the rate of the model's audio output")
    parser.add_argument("--text-only", action="store_true", help="the model answers in text and never speaks")
    parser.add_argument("--words", type=int, default=3, help="words per reply (each ~0.3 s of audio)")
    parser.add_argument("--tools", action="store_true",
                        help="the model calls the session's tools (devtools.omni_peer.scripted_calls)")
    parser.add_argument("--calls-per-reply", type=int, default=1, help="with --tools: calls per caller turn")
    parser.add_argument("--max-sessions", type=int, default=4)
    parser.add_argument("--disconnect-grace", type=float, default=30.0,
                        help="seconds a session waits for a resume after its socket drops")
    parser.add_argument("--record", help="append what the scripted engine cores do to this file, one JSON line "
                                         "each (devtools.omni_peer.engine_record)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, workdir: str) -> None:
    import uvicorn
    from fastapi import FastAPI
    from vllm_omni.entrypoints.duplex.serving import OmniDuplexSessionHandler
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni
    from vllm_omni.entrypoints.openai.api_server import router

    from devtools.omni_peer import orchestrator_seams
    from devtools.omni_peer.deployment import write_deployment
    from devtools.omni_peer.engine_record import EngineRecord
    from devtools.omni_peer.scripted_model import ScriptedChatProcessor
    from devtools.omni_peer.scripted_stages import PeerScript

    model_dir, deploy_path = write_deployment(workdir, max_sessions=args.max_sessions,
                                              disconnect_grace_s=args.disconnect_grace)
    record = EngineRecord(args.record)
    orchestrator_seams.install(PeerScript(sample_rate=args.sample_rate, text_only=args.text_only,
                                          word_count=args.words, calls_per_reply=args.calls_per_reply),
                               model_dir, record)
    if args.tools:
        from devtools.omni_peer import tool_seams

        tool_seams.install()
    omni = DuplexOmni(model=model_dir, deploy_config=deploy_path, log_stats=False)
    # The checkpoint's HF processor is model data we do not have; the plugin asks it only for
    # a chat template, which the scripted model renders (and its thinker reads back).
    omni.engine.plugin.processor = ScriptedChatProcessor()

    app = FastAPI()
    app.include_router(router)
    app.state.engine_client = omni
    app.state.openai_serving_duplex = OmniDuplexSessionHandler(duplex_omni=omni)
    app.state.duplex_warmup_done = None
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           ws_max_size=16 * 1024 * 1024))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    LOG.warning("vLLM-Omni peer serving on http://%s:%d (rate %d Hz%s%s)", args.host, args.port,
                args.sample_rate, ", text only" if args.text_only else "", ", calls tools" if args.tools else "")
    try:
        await server.serve()
    finally:
        omni.shutdown()
        record.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    native_stubs.install()
    if args.check:
        import silero_vad  # noqa: F401
        from vllm_omni.entrypoints.openai.api_server import router  # noqa: F401

        from devtools.omni_peer import orchestrator_seams, tool_seams  # noqa: F401  (imports vLLM-Omni's engine)
        print("vLLM-Omni serving path imports")
        return 0
    if args.port is None:
        raise SystemExit("--port is required")
    with tempfile.TemporaryDirectory(prefix="omni-peer-") as workdir:
        asyncio.run(serve(args, workdir))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
