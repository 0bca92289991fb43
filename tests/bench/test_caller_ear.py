"""The benches' caller ear: quiet counts from where a frame goes quiet, in 5 ms blocks, not from the next frame."""

import numpy as np

from bench.livekit_callers import Ear, quiet_tail_ms

TONE = (0.3 * np.sin(2 * np.pi * 440 * np.arange(960) / 48000)).astype(np.float32)


def test_a_frame_that_fades_out_in_its_first_5_ms_is_quiet_from_there():
    fade = TONE.copy()
    fade[:240] *= np.linspace(1.0, 0.0, 240, dtype=np.float32)
    fade[240:] = 0.0
    assert quiet_tail_ms(fade) == 15.0 and quiet_tail_ms(TONE) == 0.0 and quiet_tail_ms(np.zeros(960)) == 20.0
    ear = Ear()
    ear.hear(TONE)
    assert ear.quiet_since is None
    ear.hear(fade)
    assert ear.quiet_run_ms == 15.0 and ear.quiet_since is not None
    since = ear.quiet_since
    ear.hear(np.zeros(960, np.float32))  # the quiet run goes on from the fade's quiet part
    assert ear.quiet_run_ms == 35.0 and ear.quiet_since == since
    ear.hear(TONE)  # sound again: no quiet run
    assert ear.quiet_run_ms == 0.0 and ear.quiet_since is None
