"""The benchmarks' shared arithmetic: histogram percentiles from /metrics, py-spy shares, and which
rounds a growth figure may use."""

import math

from bench.stats import histogram_quantile, percentile
from bench.worker_profile import profile_shares


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does():
    buckets = {20.0: 0.0, 40.0: 10.0, 60.0: 30.0, 80.0: 40.0, math.inf: 40.0}  # cumulative
    assert histogram_quantile(buckets, 50) == 50.0  # rank 20: half way through 40-60
    assert histogram_quantile(buckets, 25) == 40.0
    assert math.isnan(histogram_quantile({math.inf: 0.0}, 50))
    assert histogram_quantile({80.0: 1.0, math.inf: 2.0}, 99) == 80.0  # in +Inf: the last finite bound


def test_percentile_is_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert math.isnan(percentile([], 95))


def test_profile_shares_name_the_innermost_known_part():
    collapsed = "\n".join([
        "main (x.py:1);PlayoutTrack.recv (webrtc/direct/tracks.py:90) 30",
        "main (x.py:1);_run_once (/usr/lib/asyncio/base_events.py:1);push_caller_frame (/w/webrtc/media/call_audio.py:1);"
        "run (/v/onnxruntime/capi/session.py:2) 50",
        "main (x.py:1);_run_once (/usr/lib/asyncio/base_events.py:1) 10",
        "main (x.py:1);_run_once (/usr/lib/asyncio/base_events.py:1);EpollSelector.select (/usr/lib/selectors.py:3) 10",
    ])
    shares = profile_shares(collapsed)
    assert shares == {"Silero VAD (onnxruntime)": 0.5, "Opus encode": 0.3, "asyncio loop and wake-ups": 0.1,
                      "woken in a wait, not yet run (not work)": 0.1}


def test_a_thread_runnable_in_a_blocking_call_is_waiting_not_working():
    """py-spy samples a thread woken in epoll or a condition until it gets a CPU: on a busy machine
    that was half of what it recorded for the LiveKit worker, and read as the event loop's cost."""
    loop = "run_forever (/usr/lib/asyncio/base_events.py:607);_run_once (/usr/lib/asyncio/base_events.py:1884)"
    collapsed = "\n".join([
        f"thread (1): job;{loop};EpollSelector.select (/usr/lib/selectors.py:468) 50",
        "thread (2): w;_worker (/usr/lib/concurrent/futures/thread.py:81);Condition.wait (/usr/lib/threading.py:331) 10",
        f"thread (1): job;{loop};_write_to_self (/usr/lib/asyncio/selector_events.py:139) 20",
        f"thread (1): job;{loop};CallAudioPath.push_caller_frame (/w/webrtc/media/call_audio.py:80) 20",
    ])
    assert profile_shares(collapsed) == {"woken in a wait, not yet run (not work)": 0.6,
                                         "asyncio loop and wake-ups": 0.2, "call audio path": 0.2}


def test_a_round_on_a_saturated_machine_is_left_out_of_the_verdicts():
    """LiveKit's 16-call round on 2 cores had every call up, but with the machine at 2.00 cores the
    callers got 7 end-of-turn answers a minute instead of 20: the worker's low figure per call was
    work not done, not linearity."""
    from bench.call_figures import Round

    saturated = Round("livekit", 16, serving=16, ready=True, machine_cores=2.0)
    busy = Round("direct", 16, serving=16, ready=True, machine_cores=1.3)
    short = Round("livekit", 16, serving=15, ready=True, machine_cores=1.5)
    assert saturated.complete and saturated.saturated(2) and not saturated.measured(2)
    assert busy.measured(2)
    assert not short.measured(2) and not short.saturated(2)
