"""The benchmarks' shared arithmetic: histogram percentiles from /metrics, py-spy shares."""

import math

from bench.call_rounds import profile_shares
from bench.stats import histogram_quantile, percentile


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
        "main (x.py:1);select (/usr/lib/selectors.py:3) 20",
    ])
    shares = profile_shares(collapsed)
    assert shares == {"Silero VAD (onnxruntime)": 0.5, "Opus encode": 0.3, "asyncio loop and wake-ups": 0.2}
