"""The reference model: a speech-in, speech-out cascade on the CPU, behind the contract.

Stage 0 recognises a user turn (Whisper base or tiny.en), stage 1 writes the reply
(echo, or any OpenAI-compatible chat endpoint), stage 2 speaks it (Piper).
Speech starts after the reply's first clause: stage 1's text is split into
clauses and forwarded to stage 2 while stage 1 is still writing.

With the OpenAI-compatible responder the model calls the session's tools: stage 1's
function calls go to the client (projected from stage 1; they have nothing to say),
the calls and outputs come back into the responder's history at turn boundaries,
and the answer to the outputs (a continuation) starts at stage 1, from that history.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.plugins.contract import (
    FUNCTION_CALL,
    REALTIME_TOOL_CHOICE,
    REALTIME_TOOLS,
    DefaultDuplexModelSessionState,
    DuplexAppendPlan,
    DuplexCapabilities,
    DuplexFence,
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexOutputDecision,
    DuplexSessionConfig,
    EncodeAudio,
    PartialStageForward,
    PrivateRuntimeKeyError,
    option,
    reject_private_runtime_keys,
    text_to_say,
    tools_in_effect,
)
from duplex_agent.plugins.engines.inprocess import InProcessEngine
from duplex_agent.plugins.reference.asr import ASR_MODELS, DEFAULT_ASR_MODEL, asr_choice_problem
from duplex_agent.plugins.reference.responders import (
    DEFAULT_MAX_TURNS,
    OpenAIResponder,
    Responder,
    make_responder,
    recent_turns,
)
from duplex_agent.plugins.reference.sentences import ClauseSplitter
from duplex_agent.plugins.reference.stages import (
    ASR_RATE,
    ConversationContext,
    RecognizerStage,
    ResponderStage,
    SynthesizerStage,
)
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane
from duplex_agent.plugins.unit_packetizer import UnitPacketizer

log = logging.getLogger("duplex_agent.models")

UNIT_SAMPLES = 1600  # 100 ms units stream into the recogniser
SYNTHESIS_RATE = 22050
RECOGNIZE, RESPOND, SYNTHESIZE = 0, 1, 2


@dataclass(slots=True)
class ReferenceOptions:
    """The reference model's flags: who writes the replies, and which Whisper hears the caller."""

    responder: str = option("echo", "who writes the replies: echo says back what it heard; openai asks an "
                                    "OpenAI-compatible chat endpoint (--openai-base-url, --openai-model)",
                            choices=("echo", "openai"))
    responder_max_turns: int = option(DEFAULT_MAX_TURNS, "earlier turns of the call the responder sees "
                                                         "(a bounded context, not the whole call)")
    openai_base_url: str = option("", "--responder openai: the endpoint's base URL, e.g. http://127.0.0.1:8000/v1 "
                                      "(vLLM, llama.cpp server, Ollama, OpenAI)")
    openai_model: str = option("", "--responder openai: the model name the endpoint serves")
    openai_api_key: str = option("", "--responder openai: the endpoint's key, if it wants one", secret=True)
    asr_model: str = option(DEFAULT_ASR_MODEL, "the Whisper model that hears the caller: base (multilingual, fewer "
                                               "words misheard) or tiny.en (English only, faster)", choices=ASR_MODELS)
    asr_language: str = option("en", "the language the caller speaks, as a Whisper code (en, de, fr, es, ...); "
                                     "other than en needs --asr-model base")


def check_base_url(base_url: str) -> None:
    """ModelStartError, in one line, for a missing --openai-base-url or one that is no http(s) URL."""
    example = "the address of an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1"
    if not base_url.strip():
        raise ModelStartError(f"--responder openai needs --openai-base-url (or DUPLEX_OPENAI_BASE_URL): {example}")
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelStartError(f"--openai-base-url {base_url!r} is not an http:// or https:// URL: {example}")


class ReferencePlugin(DuplexModelPlugin):
    plugin_id = "reference"
    options_type = ReferenceOptions
    #: Set by the worker's settings, never by a client.
    private_runtime_config_keys = frozenset({"responder", "openai_base_url", "openai_model", "openai_api_key",
                                             "asr_model", "asr_language"})

    def __init__(self, encode_audio: EncodeAudio) -> None:
        super().__init__(encode_audio)
        self._contexts: dict[str, ConversationContext] = {}
        self.data_plane = SpeechDataPlane(encode_audio, sample_rate=SYNTHESIS_RATE,
                                          on_session_closed=lambda session_id: self._contexts.pop(session_id, None))
        self.silence_continuation_samples = UNIT_SAMPLES
        self.responder_name = "echo"
        self.responder_settings: dict[str, Any] = {}
        self.responder_max_turns = DEFAULT_MAX_TURNS
        self.responder: Responder | None = None  # built with the engine
        self.asr_model, self.asr_language = DEFAULT_ASR_MODEL, "en"

    def configure(self, options: ReferenceOptions, *, max_sessions: int) -> None:
        """Take the responder and recogniser choices from the plugin's flags."""
        problem = asr_choice_problem(options.asr_model, options.asr_language)
        if problem:
            raise ModelStartError(problem)
        self.asr_model, self.asr_language = options.asr_model, options.asr_language
        self.responder_name = options.responder
        self.responder_max_turns = options.responder_max_turns
        if options.responder == "openai":
            check_base_url(options.openai_base_url)
            self.responder_settings = {"base_url": options.openai_base_url.strip(), "model": options.openai_model,
                                       "api_key": options.openai_api_key, "max_turns": options.responder_max_turns}

    def build_local_engine(self) -> InProcessEngine:
        """Loads the models (once per process) and wires the three stages."""
        from duplex_agent.plugins.reference.asr import WhisperRecognizer
        from duplex_agent.plugins.reference.tts import PiperSynthesizer

        responder = self.responder = make_responder(self.responder_name, self.responder_settings)
        log.info("loading Whisper %s", self.asr_model)
        recognizer = WhisperRecognizer.shared(self.asr_model, self.asr_language)
        log.info("loading Piper voice")
        synthesizer = PiperSynthesizer.shared()
        return InProcessEngine(
            [RecognizerStage(recognizer), ResponderStage(responder, self.context), SynthesizerStage(synthesizer)],
            max_workers=2,
        )

    async def check_at_start(self) -> None:
        """An OpenAI-compatible endpoint is asked once, briefly: a warning if it cannot be reached."""
        if isinstance(self.responder, OpenAIResponder):
            problem = await self.responder.check_reachable()
            if problem is not None:
                log.warning("the language model at %s %s; starting anyway, and replies fail until that changes",
                            self.responder.address, problem)

    def context(self, session_id: str) -> ConversationContext:
        return self._contexts.setdefault(session_id, ConversationContext())

    # ---- engine policy ----

    def configure_sampling_params(self, *, runtime_config: dict[str, object],
                                  defaults: tuple[object, ...]) -> tuple[object, ...]:
        return defaults

    def prepare_prompt_config(self, config: dict[str, object], *, state: DuplexModelSessionState,
                              payload: dict[str, object]) -> dict[str, object]:
        payload["instructions"] = config.get("instructions", "")
        payload["tools"] = config.get("tools", [])
        payload["tool_choice"] = config.get("tool_choice", "auto")
        return config

    def plan_append(self, *, request_id: str, fence: DuplexFence, session_config: dict[str, object],
                    runtime_config: dict[str, object], seq: int, turn_seq: int, payload: object, final: bool,
                    sampling_params: object) -> DuplexAppendPlan:
        return DuplexAppendPlan(request_id, RECOGNIZE, fence, payload, final, resumable=not final,
                                sampling_params=sampling_params)

    def decide_output(self, *, stage_id: int, final_stage_id: int, segment_finished: bool,
                      segment_token_ids: tuple[int, ...], segment_output_metadata: dict[str, object],
                      output: object) -> DuplexOutputDecision | None:
        if not isinstance(output, dict):
            return None
        if stage_id == RECOGNIZE and segment_finished and not str(output.get("transcript", "")).strip():
            return DuplexOutputDecision("listen", "no_speech")
        if stage_id == SYNTHESIZE and "audio" in output:
            return DuplexOutputDecision("speak")
        return None

    def user_transcript(self, *, stage_id: int, output: object, prompt: object, finished: bool) -> str | None:
        if stage_id == RECOGNIZE and finished and isinstance(output, dict):
            text = str(output.get("transcript", "")).strip()
            return text or None
        return None

    def project_intermediate_output(self, *, stage_id: int, output: object, context: object) -> bool:
        """Stage 1's function calls go to the client from stage 1 (stage 2 has no words for them)."""
        return stage_id == RESPOND and isinstance(output, dict) and FUNCTION_CALL in output

    def plan_partial_stage_output(self, orchestrator: object, stage_id: int, replica_id: int, output: object,
                                  req_state: object) -> PartialStageForward | None:
        """Stage 1's text goes to stage 2 clause by clause; stage 0's transcript goes whole, with
        the response's own tools when its ``response.create`` gave some."""
        if not isinstance(req_state, dict):
            return None
        if stage_id == RECOGNIZE:
            return self._with_response_tools(output, req_state)
        if stage_id != RESPOND:
            return None
        splitter: ClauseSplitter = req_state.setdefault("clauses", ClauseSplitter())
        delta = str(output.get("text", "")) if isinstance(output, dict) else ""
        clauses = splitter.feed(delta)
        finished = bool(req_state.get("finished"))
        if finished:
            rest = splitter.flush()
            clauses += [rest] if rest else []
            if not clauses:
                return PartialStageForward(output=None, is_final_update=True, close_only=True)
        if not clauses:
            return None
        return PartialStageForward(output={"text": " ".join(clauses)}, is_final_update=finished)

    @staticmethod
    def _with_response_tools(output: object, req_state: dict[str, Any]) -> PartialStageForward | None:
        options = req_state.get("response_options")
        if not req_state.get("finished") or not isinstance(options, dict) or not isinstance(output, dict):
            return None
        tools, choice = tools_in_effect({REALTIME_TOOLS: output.get("tools"),
                                         REALTIME_TOOL_CHOICE: output.get("tool_choice")}, options)
        return PartialStageForward(output={**output, "tools": tools, "tool_choice": choice}, is_final_update=True)

    def commit_model_context(self, *, session_id: str | None, assistant_text: str) -> None:
        if session_id is not None and assistant_text:
            context = self.context(session_id)
            context.history.append({"role": "assistant", "content": assistant_text})
            # Keep only what the responder will see.
            context.history[:] = recent_turns(context.history, self.responder_max_turns)

    def commit_model_function_item(self, *, session_id: str | None, item: Mapping[str, object]) -> None:
        """A call joins the assistant message it follows (the chat API's ``tool_calls``); an output
        is a ``tool`` message."""
        if session_id is None:
            return
        history = self.context(session_id).history
        if item.get("type") == "function_call":
            call = {"id": str(item.get("call_id")), "type": "function",
                    "function": {"name": str(item.get("name")), "arguments": str(item.get("arguments") or "{}")}}
            if history and history[-1].get("role") == "assistant":
                history[-1] = {**history[-1], "tool_calls": [*(history[-1].get("tool_calls") or []), call]}
            else:
                history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.get("type") == "function_call_output":
            history.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                            "content": str(item.get("output"))})
        history[:] = recent_turns(history, self.responder_max_turns)

    def plan_response_continuation(self, *, request_id: str, fence: DuplexFence, session_config: dict[str, object],
                                   runtime_config: dict[str, object], turn_seq: int,
                                   response_options: dict[str, object],
                                   sampling_params: tuple[object, ...]) -> DuplexAppendPlan | None:
        """Stage 1 answers from the history (where the outputs are by now), with the response's
        tools; a text to say goes straight to stage 2, which speaks it as it is."""
        say = text_to_say(response_options)
        if say is not None:
            return DuplexAppendPlan(request_id, SYNTHESIZE, fence, {"text": say}, True, resumable=False,
                                    sampling_params=sampling_params[SYNTHESIZE] if len(sampling_params) > SYNTHESIZE
                                    else None)
        tools, choice = tools_in_effect({REALTIME_TOOLS: runtime_config.get("tools"),
                                         REALTIME_TOOL_CHOICE: runtime_config.get("tool_choice")}, response_options)
        payload = {"continuation": True, "instructions": runtime_config.get("instructions", ""), "tools": tools,
                   "tool_choice": choice}
        return DuplexAppendPlan(request_id, RESPOND, fence, payload, True, resumable=False,
                                sampling_params=sampling_params[RESPOND] if len(sampling_params) > RESPOND else None)

    # ---- session policy ----

    def create_session_state(self) -> DuplexModelSessionState:
        return DefaultDuplexModelSessionState(audio_buffer=UnitPacketizer(unit_samples=UNIT_SAMPLES, sample_rate=ASR_RATE))

    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities:
        return DuplexCapabilities(
            plugin_id=self.plugin_id, input_sample_rate=ASR_RATE, unit_samples=UNIT_SAMPLES,
            output_sample_rate=SYNTHESIS_RATE, max_sessions=max_sessions, input_mode="turn",
            # The chat endpoint calls tools; answering their outputs needs the caller's response.create.
            supports_tools=self.responder_name == "openai", replies_to_tool_output=False,
            speaks_given_text=True,
        )

    def validate_client_extra_body(self, extra_body: object) -> None:
        reject_private_runtime_keys(extra_body, self.private_runtime_config_keys,
                                    message="extra_body sets server-owned keys: ", error_cls=PrivateRuntimeKeyError)

    async def prepare_runtime_config(self, config: DuplexSessionConfig, *, model_config: object | None) -> dict[str, object]:
        return self.runtime_config_for_update(config, {})

    def runtime_config_for_update(self, config: DuplexSessionConfig, current: Mapping[str, object]) -> dict[str, object]:
        tools, choice = tools_in_effect(config.extra_body)
        return {**current, "instructions": config.instructions, "tools": tools, "tool_choice": choice}

    def data_plane_context(self, **kwargs: object) -> object:
        return kwargs


