"""The reference model's three CPU stages: recognise, respond, synthesise.

Blocking model calls run on the engine's bounded pool; each stage checks its
request's cancel flag between pieces of work, so an aborted turn produces no
more audio and frees the CPU after at most one clause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duplex_agent.plugins.contract import FUNCTION_CALL
from duplex_agent.plugins.contract.engine import request_session_id
from duplex_agent.plugins.engines.inprocess import PythonStage, StageRequest, StageYield
from duplex_agent.plugins.reference.asr import WhisperRecognizer
from duplex_agent.plugins.reference.responders import Message, Responder, ToolCall
from duplex_agent.plugins.reference.speculation import SpeculativeTranscript
from duplex_agent.plugins.reference.tts import PiperSynthesizer

log = logging.getLogger("duplex_agent.reference")

ASR_RATE = 16000
#: What an append's payload tells the responder, carried through the recogniser with the transcript.
PROMPT_KEYS = ("instructions", "tools", "tool_choice")


@dataclass(slots=True)
class ConversationContext:
    """What the responder remembers of one session: only words the caller heard, and the
    function calls and outputs among them (chat messages)."""

    instructions: str = ""
    history: list[Message] = field(default_factory=list)


class RecognizerStage(PythonStage):
    """Stage 0: gathers a turn's audio units; on the turn's end, Whisper's transcript.

    Pieces of the turn are transcribed at its pauses (speculation.py), so most of the
    words are ready when the turn ends.
    """

    def __init__(self, recognizer: WhisperRecognizer) -> None:
        self._recognizer = recognizer

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        transcript = SpeculativeTranscript(lambda audio: request.offload(self._recognizer.transcribe, audio), ASR_RATE)
        prompt: dict[str, Any] = {"instructions": ""}
        async for payload in request.inputs():
            assert isinstance(payload, dict)
            prompt.update((key, payload[key]) for key in PROMPT_KEYS if key in payload)
            transcript.add(np.frombuffer(payload["audio"], dtype="<f4"))
        started = time.monotonic()
        text = await transcript.text()
        waited_ms = 1000.0 * (time.monotonic() - started)
        yield StageYield({"transcript": text, **prompt}, finished=True,
                         metadata={"asr_wait_ms": waited_ms, "transcriptions": transcript.transcriptions})


class ResponderStage(PythonStage):
    """Stage 1: the reply's text, streamed, and its function calls, from the responder and the
    heard history. A ``continuation`` payload answers from the history alone."""

    def __init__(self, responder: Responder, contexts: Callable[[str], ConversationContext]) -> None:
        self._responder = responder
        self._contexts = contexts

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        context = self._contexts(request_session_id(request.request_id))
        async for payload in request.inputs():
            if not isinstance(payload, dict):
                continue
            history = list(context.history)
            user_text: str | None = None
            if not payload.get("continuation"):
                user_text = str(payload.get("transcript", ""))
                context.history.append({"role": "user", "content": user_text})
            tools = payload.get("tools") or []
            async for piece in self._responder.respond(history, user_text, tools=tools,
                                                       tool_choice=payload.get("tool_choice") or "auto"):
                if isinstance(piece, ToolCall):
                    yield StageYield({FUNCTION_CALL: {"call_id": piece.call_id, "name": piece.name,
                                                      "arguments": piece.arguments}})
                else:
                    yield StageYield({"text": piece})


class SynthesizerStage(PythonStage):
    """Stage 2: Piper speech for each clause, as it arrives."""

    def __init__(self, synthesizer: PiperSynthesizer) -> None:
        self._synthesizer = synthesizer

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        async for payload in request.inputs():
            if not isinstance(payload, dict) or not str(payload.get("text", "")).strip():
                continue
            text = str(payload["text"]).strip()
            started = time.monotonic()
            audio = await request.offload(self._speak, text, request)
            if audio is None:
                return
            took_ms = 1000.0 * (time.monotonic() - started)
            audio_ms = 1000.0 * audio.size / self._synthesizer.sample_rate
            metadata: dict[str, object] = {"synthesis_ms": took_ms}
            if took_ms > audio_ms:
                # Slower than real time: the caller would hear gaps. Say so.
                metadata["lag_ms"] = took_ms - audio_ms
                log.warning("synthesis is behind real time by %.0f ms (%s)", took_ms - audio_ms, request.request_id)
            yield StageYield({"audio": audio, "text": text, "sample_rate": self._synthesizer.sample_rate},
                             metadata=metadata)

    def _speak(self, text: str, request: StageRequest) -> np.ndarray | None:
        pieces = []
        for piece in self._synthesizer.synthesize(text):
            if request.cancelled.is_set():
                return None
            pieces.append(piece)
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
