"""libopus through ctypes: what PyAV's wrapper does not expose (in-band FEC decoding,
packet-loss concealment, encoder controls while encoding).

The library is the one PyAV's wheel bundles (``av.libs/libopus-*.so*``, libopus 1.5+),
else the system's ``libopus.so.0`` (Debian's libopus0). Each decoder and encoder is
used from one thread (the call's event loop).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os

import numpy as np

SAMPLE_RATE = 48000
#: The longest Opus packet: 120 ms at 48 kHz.
MAX_FRAME_SAMPLES = 5760
#: The most frames one Opus packet holds (120 ms of 2.5 ms frames).
_MAX_FRAMES = 48
#: opus_encoder_create's application for speech.
APPLICATION_VOIP = 2048
_MAX_PACKET_BYTES = 1500

_SET_BITRATE = 4002
_SET_COMPLEXITY = 4010
_SET_INBAND_FEC = 4012
_GET_INBAND_FEC = 4013
_SET_PACKET_LOSS_PERC = 4014
_GET_PACKET_LOSS_PERC = 4015
_RESET_STATE = 4028


class OpusError(Exception):
    """libopus refused a packet or a call (its negative error code)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: libopus error {code}")
        self.code = code


def _candidates() -> list[str]:
    import av

    site = os.path.dirname(os.path.dirname(av.__file__))
    found = sorted(glob.glob(os.path.join(site, "av.libs", "libopus*.so*")))
    found += sorted(glob.glob(os.path.join(os.path.dirname(av.__file__), ".dylibs", "libopus*")))
    system = ctypes.util.find_library("opus")
    return found + ([system] if system else [])


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded libopus (OSError when neither PyAV's nor the system's can be found)."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        break
    else:
        raise OSError("no libopus found (PyAV's wheel bundles one; or install Debian's libopus0)")
    p, i, b = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    f, s = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int16)
    err = ctypes.POINTER(ctypes.c_int)
    lib.opus_get_version_string.restype = ctypes.c_char_p
    lib.opus_decoder_create.restype, lib.opus_decoder_create.argtypes = p, [ctypes.c_int32, i, err]
    lib.opus_decoder_destroy.argtypes = [p]
    lib.opus_decode_float.restype = i
    lib.opus_decode_float.argtypes = [p, b, ctypes.c_int32, f, i, i]
    lib.opus_packet_get_nb_samples.restype = i
    lib.opus_packet_get_nb_samples.argtypes = [b, ctypes.c_int32, ctypes.c_int32]
    lib.opus_packet_parse.restype = i
    lib.opus_packet_parse.argtypes = [b, ctypes.c_int32, p, p, ctypes.POINTER(ctypes.c_int16), p]
    lib.opus_encoder_create.restype, lib.opus_encoder_create.argtypes = p, [ctypes.c_int32, i, i, err]
    lib.opus_encoder_destroy.argtypes = [p]
    lib.opus_encode.restype = ctypes.c_int32
    lib.opus_encode.argtypes = [p, s, i, ctypes.c_char_p, ctypes.c_int32]
    if hasattr(lib, "opus_packet_has_lbrr"):  # libopus 1.5+
        lib.opus_packet_has_lbrr.restype = i
        lib.opus_packet_has_lbrr.argtypes = [b, ctypes.c_int32]
    return lib


def version() -> str:
    return library().opus_get_version_string().decode()


def packet_samples(packet: bytes) -> int:
    """The packet's duration in samples at 48 kHz (OpusError for a packet that does not parse: its
    header, or frame lengths that run past its end, as when a packet of several frames is cut short;
    a single frame cut short cannot be told from a short one)."""
    lib = library()
    n = lib.opus_packet_get_nb_samples(packet, len(packet), SAMPLE_RATE) if packet else -4
    if n <= 0 or n > MAX_FRAME_SAMPLES:
        raise OpusError("packet does not parse", n if n <= 0 else -4)
    frames = lib.opus_packet_parse(packet, len(packet), None, None, (ctypes.c_int16 * _MAX_FRAMES)(), None)
    if frames <= 0:
        raise OpusError("packet does not parse", frames if frames < 0 else -4)
    return n


def packet_has_fec(packet: bytes) -> bool:
    """Whether the packet carries in-band FEC (LBRR) for the frame before it."""
    lib = library()
    if not packet:
        return False
    if hasattr(lib, "opus_packet_has_lbrr"):
        return lib.opus_packet_has_lbrr(packet, len(packet)) > 0
    return packet[0] >> 3 < 16  # older libopus: SILK or hybrid packets may carry it


class OpusDecoder:
    """One mono 48 kHz decoder: packets, FEC from the next packet, or concealment, as float32."""

    def __init__(self) -> None:
        lib = library()
        error = ctypes.c_int()
        self._state = lib.opus_decoder_create(SAMPLE_RATE, 1, ctypes.byref(error))
        if not self._state:
            raise OpusError("decoder create", error.value)
        self._lib = lib
        self._out = np.zeros(MAX_FRAME_SAMPLES, np.float32)
        self._out_ptr = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def decode(self, packet: bytes) -> np.ndarray:
        return self._run(packet, MAX_FRAME_SAMPLES, 0, "decode")

    def decode_fec(self, next_packet: bytes, samples: int) -> np.ndarray:
        """The ``samples`` before ``next_packet``, from its in-band FEC (libopus conceals if it has none)."""
        return self._run(next_packet, samples, 1, "FEC decode")

    def conceal(self, samples: int) -> np.ndarray:
        """libopus's packet-loss concealment for ``samples`` (a multiple of 2.5 ms)."""
        return self._run(None, samples, 0, "concealment")

    def reset(self) -> None:
        self._lib.opus_decoder_ctl(ctypes.c_void_p(self._state), ctypes.c_int(_RESET_STATE))

    def _run(self, packet: bytes | None, samples: int, fec: int, what: str) -> np.ndarray:
        n = self._lib.opus_decode_float(self._state, packet, len(packet) if packet else 0, self._out_ptr, samples, fec)
        if n < 0:
            raise OpusError(what, n)
        return self._out[:n].copy()

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.opus_decoder_destroy(self._state)
            self._state = None


class OpusEncoder:
    """One mono 48 kHz voice encoder whose FEC and expected loss can change between frames."""

    def __init__(self, bitrate: int, *, complexity: int = 10, expected_loss_percent: int = 0) -> None:
        lib = library()
        error = ctypes.c_int()
        self._state = lib.opus_encoder_create(SAMPLE_RATE, 1, APPLICATION_VOIP, ctypes.byref(error))
        if not self._state:
            raise OpusError("encoder create", error.value)
        self._lib = lib
        self._out = ctypes.create_string_buffer(_MAX_PACKET_BYTES)
        self._ctl(_SET_BITRATE, bitrate)
        self._ctl(_SET_COMPLEXITY, complexity)
        self.set_expected_loss(expected_loss_percent)

    def set_expected_loss(self, percent: int) -> None:
        """Plan in-band FEC for ``percent`` loss; 0 turns FEC off (it costs bits only when loss is expected)."""
        percent = max(0, min(100, int(percent)))
        self._ctl(_SET_PACKET_LOSS_PERC, percent)
        self._ctl(_SET_INBAND_FEC, 1 if percent else 0)

    @property
    def expected_loss_percent(self) -> int:
        return self._get(_GET_PACKET_LOSS_PERC)

    @property
    def fec(self) -> bool:
        return bool(self._get(_GET_INBAND_FEC))

    def encode(self, pcm: np.ndarray) -> bytes:
        """One frame of int16 mono samples (2.5-60 ms) -> one Opus packet."""
        pcm = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
        n = self._lib.opus_encode(self._state, pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_int16)), pcm.size,
                                  self._out, _MAX_PACKET_BYTES)
        if n < 0:
            raise OpusError("encode", n)
        return self._out.raw[:n]

    def _ctl(self, request: int, value: int) -> None:
        code = self._lib.opus_encoder_ctl(ctypes.c_void_p(self._state), ctypes.c_int(request), ctypes.c_int(value))
        if code < 0:
            raise OpusError(f"encoder ctl {request}", code)

    def _get(self, request: int) -> int:
        value = ctypes.c_int()
        code = self._lib.opus_encoder_ctl(ctypes.c_void_p(self._state), ctypes.c_int(request), ctypes.byref(value))
        if code < 0:
            raise OpusError(f"encoder ctl {request}", code)
        return value.value

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.opus_encoder_destroy(self._state)
            self._state = None
