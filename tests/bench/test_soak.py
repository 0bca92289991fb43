"""The soak's own arithmetic: growth per call with the live calls held constant, and a call's outcome."""

from __future__ import annotations

import json

from bench.soak_calls import CallResult, judge
from bench.soak_probe import Sample, growth_per_100_calls, slope


def test_what_live_calls_hold_is_not_read_as_growth_or_shrinkage():
    # 5 MB per live call, 0.01 MB left behind per finished one; the last sample after every call ended.
    points = [(c, live, 100 + 0.01 * c + 5 * live) for c, live in [(0, 4), (1, 4), (2, 3), (3, 4), (5, 2), (8, 0)]]
    assert abs(slope(points) - 0.01) < 1e-9


def test_growth_counts_only_samples_after_warm_up():
    samples = [Sample(t, calls, 0, {"rss_mb": 400.0 + (50.0 if t < 30 else 0.0) + calls}) for t, calls in
               [(0, 0), (10, 1), (20, 2), (30, 3), (40, 4), (50, 5), (60, 6)]]
    rate, n = growth_per_100_calls(samples, "rss_mb", warmup_s=30)
    assert n == 4 and abs(rate - 100.0) < 1e-6


def done(**caller) -> str:
    return json.dumps({"event": "done", "callers": [{"said": ["a", "b"], "no_reply": 0, "frames": 10, **caller}]})


def test_a_call_that_never_heard_the_agent_or_whose_caller_failed_is_dropped():
    assert judge(CallResult(0, "livekit", 0, 30), 0, done(frames=0), "").dropped == "never heard the agent"
    assert judge(CallResult(0, "direct", 0, 30), 0, done(error="resume failed"), "").dropped.startswith("caller error")
    assert judge(CallResult(0, "direct", 0, 30), 1, "", "Traceback").dropped.startswith("caller process failed")
    kept = judge(CallResult(0, "direct", 0, 30), 0, done(no_reply=1, resumes=1), "")
    assert not kept.dropped and kept.questions == 2 and kept.unanswered == 1 and kept.resumes == 1
