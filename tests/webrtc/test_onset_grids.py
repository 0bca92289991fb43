"""The onset detector's two grids: the main one scores every window once, as the session's VAD
would; the offset one, only while asked (the agent speaks), ends a window 16 ms after each main one."""

import numpy as np

from devtools.speech import speak
from duplex_agent.agent.models.vad import SileroVadModel, VadStream
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.webrtc.media.onset import CallerOnsetDetector

RATE = 48000
FRAME = 960


def test_the_offset_grid_runs_only_while_asked_and_ends_a_window_halfway_through_each_main_one():
    model = SileroVadModel.shared()
    audio = np.concatenate([np.zeros(RATE // 3, np.float32), speak("Wait, stop.", RATE)])
    detector = CallerOnsetDetector(model)
    windows = []
    for k, i in enumerate(range(0, audio.size - FRAME + 1, FRAME)):  # frame k arrives at time k
        windows += detector.push(audio[i : i + FRAME], RATE, float(k), half_step=10 <= k < 40)
    main = [w for w in windows if not w.half_step]
    offset = [w for w in windows if w.half_step]
    # the main grid is the session's: every window once, the same scores as a lone stream's
    alone, resampler, lone = VadStream(model), StreamingResampler(RATE, 16000, quality="QQ"), []
    for i in range(0, audio.size - FRAME + 1, FRAME):
        alone.push(resampler.process(audio[i : i + FRAME]))
        lone += alone.probabilities
    assert [w.probability for w in main] == lone
    assert [w.end_ms for w in main] == [32.0 * (n + 1) for n in range(len(main))]
    # offset windows only from frame 10 (200 ms) to frame 40 (800 ms), each 16 ms past a main window
    assert offset and all(200.0 < w.end_ms <= 800.0 + 32.0 for w in offset)
    assert all((w.end_ms - 16.0) % 32.0 == 0.0 for w in offset)
    assert detector.half_step_windows_scored == len(offset)
    assert [w.end_ms for w in windows] == sorted(w.end_ms for w in windows)
    assert any(w.probability >= 0.5 for w in offset)  # the speech is heard on the offset grid too
