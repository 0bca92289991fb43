"""Moshi on a fixed batch of slots: Mimi encode -> ``LMGen.step`` -> Mimi decode, one batched call each.

The model code is the ``moshi`` package's. Its streaming modules keep state per batch row; a row
is one conversation's slot. ``reset_slots`` resets rows (``reset_streaming(mask)``) and ``step``
runs every row while ``set_exec_mask`` leaves free rows' state untouched. The batch size never
changes, so each row's arithmetic is the same whoever sits in the other rows, and on CUDA the
package's CUDA graphs (``CUDAGraphed`` inside its streaming states) replay one captured shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeVar

import numpy as np

from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.plugins.moshi.checkpoint import CheckpointFiles, cached_repo_files, config_from_file, explicit_files
from duplex_agent.plugins.moshi.configs import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    TEXT_PADDING_IDS,
    full_lm_config,
    tiny_lm_config,
    tiny_mimi_config,
)
from duplex_agent.plugins.moshi.turns import FloorTracker

if TYPE_CHECKING:  # the moshi extra; without it these are Any
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

log = logging.getLogger("duplex_agent.moshi")
_T = TypeVar("_T")


class MoshiSampling(TypedDict, total=False):
    """``LMGen``'s sampling settings that a spec may set; the others keep Moshi's defaults."""

    temp: float
    temp_text: float
    top_k: int
    top_k_text: int
    cfg_coef: float

TINY_TEXT_CARD = 64
#: Configs whose weights are random unless files are given: the tiny test model and Moshi 7B's shape.
RANDOM_CONFIGS = ("tiny", "7b-random")
#: Words the tiny config's text tokens stand for (it has no tokenizer; its weights are random).
_TINY_WORDS = ("la", "di", "da", "mo", "shi", "ka", "ru", "to", "ne", "po", "mi", "so")


@dataclass(slots=True)
class MoshiSpec:
    """Which Moshi to run and where (the CLI's --moshi-* and --device flags)."""

    #: "tiny" for the random-weight test model; "7b-random" for Moshi 7B's shape with random weights
    #: (benchmarks); a config.json path; "" for the checkpoint's own shape.
    config: str = "tiny"
    repo: str = ""
    moshi_weights: str = ""
    mimi_weights: str = ""
    tokenizer: str = ""
    #: "auto" (CUDA when there is one), "cpu", "cuda" or "cuda:N".
    device: str = "auto"
    #: Greedy decoding (tests); otherwise Moshi's own sampling defaults.
    greedy: bool = False
    seed: int = 1234
    sampling: MoshiSampling = field(default_factory=MoshiSampling)
    #: Let moshi torch.compile its hot functions (CUDA only; the first steps then take minutes).
    compile: bool = False

    @property
    def files_given(self) -> bool:
        """A weight or tokenizer file is named (then it is read, whatever the config)."""
        return bool(self.moshi_weights or self.mimi_weights or self.tokenizer)

    @property
    def random_weights(self) -> bool:
        """No weight file is read: a random-weight config, and no file given."""
        return self.config in RANDOM_CONFIGS and not self.files_given


@dataclass(slots=True)
class SlotOutput:
    """One slot's output for one frame."""

    audio: np.ndarray  # float32, FRAME_SAMPLES at 24 kHz
    text_token: int
    audio_tokens: tuple[int, ...]
    text: str
    speaking: bool
    #: This frame ended the model's turn (it went quiet).
    yielded: bool


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelStartError(f"--device {name!r} is not a device torch knows (use cpu, cuda or cuda:N)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelStartError(f"--device {name} asks for a GPU, but torch sees no CUDA device here "
                              f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ModelStartError(f"--device {name!r}: only cpu and cuda are supported")
    return device


class MoshiBatch:
    """Moshi's Mimi and LM in streaming mode over ``capacity`` slots."""

    frame_samples = FRAME_SAMPLES
    sample_rate = SAMPLE_RATE

    def __init__(self, mimi, lm, *, capacity: int, decode_text: Callable[[int], str], greedy: bool = False,
                 sampling: MoshiSampling | None = None, quiet_frames_to_yield: int = 10,
                 compile: bool = False) -> None:
        import torch
        from moshi.models.lm import LMGen

        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.device = lm.device
        self._torch = torch
        self._compile = compile and self.device.type == "cuda"
        self._mimi = mimi
        self._decode_text = decode_text
        # Out-of-sync support: every slot keeps its own offset, so slots join at any frame.
        self._gen = LMGen(lm, use_sampling=not greedy, support_out_of_sync=True, **(sampling or MoshiSampling()))
        self._audio_codebooks = lm.dep_q
        self._streaming = ExitStack()
        self._streaming.enter_context(self._mimi.streaming(capacity))
        self._streaming.enter_context(self._gen.streaming(capacity))
        self._floor = [FloorTracker(quiet_frames_to_yield) for _ in range(capacity)]

    def close(self) -> None:
        """Leave streaming mode, so the same models can be batched again at another size."""
        self._streaming.close()

    def reset_slots(self, slots: Sequence[int]) -> None:
        """Fresh conversation state in these slots (a session joins)."""
        if not slots:
            return
        mask = self._torch.zeros(self.capacity, dtype=self._torch.bool, device=self.device)
        mask[list(slots)] = True
        with self._torch.no_grad():
            self._mimi.reset_streaming(mask)
            self._gen.reset_streaming(mask)
        for slot in slots:
            self._floor[slot] = FloorTracker(self._floor[slot].quiet_frames_to_yield)

    def step(self, frames: np.ndarray, active: np.ndarray) -> list[SlotOutput | None]:
        """One frame for every slot: ``frames`` [capacity, 1920] float32, ``active`` [capacity] bool.

        Inactive slots' state is left as it was. A slot gets None until its first output frame
        (the LM's delay: two frames after it joined).
        """
        torch = self._torch
        with torch.no_grad(), _compile_unless(self._compile):
            exec_mask = torch.from_numpy(np.ascontiguousarray(active, dtype=bool)).to(self.device)
            pcm = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).to(self.device)[:, None, :]
            self._mimi.set_exec_mask(exec_mask)
            self._gen.set_exec_mask(exec_mask)
            codes = self._mimi.encode(pcm)
            tokens = self._gen.step(codes[:, :, :1])
            assert tokens is not None  # out-of-sync mode always answers; unready rows hold -2
            text = tokens[:, 0, 0]
            audio_tokens = tokens[:, 1:1 + self._audio_codebooks]
            ready = exec_mask & (audio_tokens >= 0).all(dim=1)[:, 0]
            # Mimi decodes only ready rows; the others' decoder state waits for real tokens.
            self._mimi.set_exec_mask(ready)
            out = self._mimi.decode(audio_tokens.clamp(min=0))
            out = torch.where(ready[:, None, None], out, torch.zeros_like(out))
            text_ids = text.cpu().numpy()
            audio_ids = audio_tokens[:, :, 0].cpu().numpy()
            audio = out[:, 0, :].float().cpu().numpy()
            ready_np = ready.cpu().numpy()
        results: list[SlotOutput | None] = []
        for slot in range(self.capacity):
            if not ready_np[slot]:
                results.append(None)
                continue
            token = int(text_ids[slot])
            words = token >= 0 and token not in TEXT_PADDING_IDS
            speaking, yielded = self._floor[slot].push(words)
            piece = self._decode_text(token) if words else ""
            results.append(SlotOutput(audio[slot], token, tuple(int(t) for t in audio_ids[slot]), piece, speaking,
                                      yielded))
        return results


@contextmanager
def _compile_unless(compile: bool) -> Iterator[None]:
    """moshi torch.compiles a few functions; on the CPU (and on a GPU unless asked) they run as they are,
    since compiling takes minutes and recompiles for every new shape."""
    if compile:
        yield
        return
    from moshi.utils.compile import no_compile

    with no_compile():
        yield


def load_moshi(spec: MoshiSpec, *, capacity: int) -> MoshiBatch:
    """The models the spec names, batched over ``capacity`` slots."""
    models = load_models(spec)
    log.info("moshi loaded on %s (%s), %d slots", models.lm.device, models.lm.dtype, capacity)
    return models.batch(capacity)


@dataclass(slots=True)
class MoshiModels:
    mimi: MimiModel
    lm: LMModel
    decode_text: Callable[[int], str]
    spec: MoshiSpec

    def batch(self, capacity: int) -> MoshiBatch:
        """Streaming over ``capacity`` slots (close the previous batch of these models first)."""
        return MoshiBatch(self.mimi, self.lm, capacity=capacity, decode_text=self.decode_text,
                          greedy=self.spec.greedy, sampling=self.spec.sampling, compile=self.spec.compile)


def load_models(spec: MoshiSpec) -> MoshiModels:
    """Build the models the spec names; ModelStartError (never a traceback) when it cannot."""
    try:
        import torch
        from moshi.models import loaders
    except ImportError as exc:
        raise ModelStartError(f"the moshi package is not installed ({exc}); run `make install-moshi` "
                              "(docs/architecture.md, 'Moshi')") from exc
    device = resolve_device(spec.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    random_config = spec.config in RANDOM_CONFIGS  # a built-in shape, not a config.json
    tiny = spec.config == "tiny"
    files: CheckpointFiles | None = None
    if spec.files_given:
        lm_config = None if random_config or not spec.config else config_from_file(spec.config)
        files = explicit_files(spec.moshi_weights, spec.mimi_weights, spec.tokenizer, need_tokenizer=not tiny,
                               lm_config=lm_config)
    elif not random_config:
        files = cached_repo_files(spec.repo)
        if spec.config:
            files = CheckpointFiles(files.moshi_weights, files.mimi_weights, files.tokenizer,
                                    config_from_file(spec.config))
    if tiny:
        lm_config, mimi_config = tiny_lm_config(TINY_TEXT_CARD), tiny_mimi_config()
    elif files is None:
        lm_config, mimi_config = full_lm_config(), None
    else:
        lm_config, mimi_config = files.lm_config or full_lm_config(), None
    num_codebooks = max(lm_config["dep_q"], lm_config["n_q"] - lm_config["dep_q"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        mimi = _load(lambda: loaders.get_mimi(files.mimi_weights if files else None, mimi_config, device=device,
                                              num_codebooks=num_codebooks), "Mimi", files and files.mimi_weights)
        lm = _load(lambda: loaders.get_moshi_lm(files.moshi_weights if files else None, lm_kwargs=lm_config,
                                                device=device, dtype=dtype), "Moshi LM", files and files.moshi_weights)
        if files is None:
            _spread_random_codebooks(mimi)
    if files is None:
        print(f"moshi: {spec.config} config with RANDOM weights (for tests, benchmarks and demos; "
              "it says nothing sensible)", flush=True)
    decode_text = _text_decoder(files.tokenizer if files else None)
    torch.manual_seed(spec.seed)  # Moshi's sampling draws from torch's global generator
    return MoshiModels(mimi, lm, decode_text, spec)


def _spread_random_codebooks(mimi) -> None:
    """A fresh Mimi's codebooks are all zeros until k-means fills them in training. Run the
    quantizer's own k-means initialisation once on the random encoder's latents of varied audio,
    so that different audio maps to different codes in the random-weight model."""
    import torch

    generator = torch.Generator().manual_seed(7)
    seconds = torch.linspace(0, 4, 4 * SAMPLE_RATE)
    pitch = 80 + 400 * torch.rand(16, 1, 1, generator=generator)
    audio = 0.5 * torch.rand(16, 1, 1, generator=generator) * torch.sin(2 * torch.pi * pitch * seconds)
    audio = audio + 0.05 * torch.randn(audio.shape, generator=generator)
    quantizer = mimi.quantizer
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(audio.to(next(mimi.parameters()).device))
        dropouts = {m: m.q_dropout for m in quantizer.modules() if hasattr(m, "q_dropout")}
        for module in dropouts:
            module.q_dropout = False
        quantizer.train()
        quantizer(latent, int(mimi.frame_rate))
        quantizer.eval()
        for module, value in dropouts.items():
            module.q_dropout = value


def _load(build: Callable[[], _T], what: str, path: object) -> _T:
    try:
        return build()
    except ModelStartError:
        raise
    except Exception as exc:  # a wrong-shape or corrupt file: size mismatch, missing keys, bad header
        first = str(exc).strip().splitlines()
        detail = "; ".join(line.strip() for line in first[:3])
        raise ModelStartError(f"{what} checkpoint {path} does not fit the configured shape "
                              f"({type(exc).__name__}: {detail[:400]})") from exc


def _text_decoder(tokenizer_path) -> Callable[[int], str]:
    if tokenizer_path is None:
        return lambda token: " " + _TINY_WORDS[token % len(_TINY_WORDS)]
    import sentencepiece

    try:
        processor = sentencepiece.SentencePieceProcessor(str(tokenizer_path))
    except Exception as exc:
        raise ModelStartError(f"text tokenizer {tokenizer_path} cannot be read: {exc}") from exc
    return lambda token: processor.id_to_piece(token).replace("\u2581", " ")
