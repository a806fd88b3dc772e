"""summarize() on a hand-made result: a failed request is a missed SLO, never left out."""

from __future__ import annotations

from array import array

import pytest
from kvfleet_sim.fleet import SimResult
from kvfleet_sim.replica import Finished
from kvfleet_sim.report import miss_windows, summarize

TTFT_SLO_S, ITL_SLO_S = 0.5, 0.1


def result(finished: list[Finished]) -> SimResult:
    return SimResult(finished, array("d"), timeline=[], lifetimes=[], end_s=10.0,
                     num_scale_events=0, num_clipped=0)


# (arrival, first token, end, output tokens): TTFT 0.4, 0.5 (at the SLO: met), 0.6 (past
# it); mean ITL (end - first) / (tokens - 1) = 1.0 / 10, at the ITL SLO
MET = Finished("q0", "r0", 0.0, 0.4, 1.4, 11)
AT_SLO = Finished("q1", "r0", 1.0, 1.5, 2.5, 11)
LATE = Finished("q2", "r0", 2.0, 2.6, 3.6, 11)
# failed at once (its replica went away): "instant", and still a missed SLO
FAILED = Finished("q3", "r1", 3.0, 3.0, 3.0, 0, is_aborted=True)


def test_a_failed_request_counts_as_a_missed_slo():
    s = summarize("x", result([MET, AT_SLO, LATE, FAILED]), TTFT_SLO_S, ITL_SLO_S)
    assert s.num_requests == 4 and s.num_failed == 1
    assert s.slo_attainment == pytest.approx(2 / 4)  # not 2/3 (failure left out), not 3/4
    # latencies are over the requests that finished: the failure's zero TTFT is not one
    assert (s.ttft_p50_s, s.ttft_p99_s) == pytest.approx((0.5, 0.6))
    assert s.e2e_p50_s == pytest.approx(1.5)


def test_failing_a_request_never_raises_attainment():
    """The lever a scaler must not have: failing the late request instead of serving it."""
    served = summarize("served", result([MET, AT_SLO, LATE]), TTFT_SLO_S, ITL_SLO_S)
    late_failed = Finished("q2", "r0", 2.0, 2.0, 2.0, 0, is_aborted=True)
    failed = summarize("failed", result([MET, AT_SLO, late_failed]), TTFT_SLO_S, ITL_SLO_S)
    assert served.slo_attainment == failed.slo_attainment == pytest.approx(2 / 3)
    assert failed.num_failed == 1 and failed.num_requests == served.num_requests == 3


def test_only_failures_in_the_window_count():
    # the failure arrived after the measured window: neither counted nor a miss
    s = summarize("x", result([FAILED, MET, AT_SLO]), TTFT_SLO_S, ITL_SLO_S, start_s=0.0,
                  end_s=2.0)
    assert s.num_requests == 2 and s.num_failed == 0 and s.slo_attainment == 1.0
    all_failed = summarize("x", result([FAILED]), TTFT_SLO_S, ITL_SLO_S)
    assert all_failed.slo_attainment == 0.0 and all_failed.num_failed == 1


# first token in time (TTFT 0.1), mean inter-token time 1.1 / 10 = 0.11, past the ITL SLO
SLOW = Finished("q4", "r0", 4.0, 4.1, 5.2, 11)


def test_miss_windows_place_each_miss_where_it_arrived_beside_the_replicas_ready():
    r = result([MET, AT_SLO, LATE, FAILED, SLOW])
    # (t, provisioned, ready): one decision before the window, three in [0, 2) (the most
    # ready 3, the last 1), none in [2, 4), one in [4, 5)
    r.timeline = [(-1.0, 2, 1), (0.5, 2, 2), (1.5, 3, 3), (1.8, 3, 1), (4.5, 1, 2)]
    rows = [(w.start_s, w.num_arrivals, w.num_ttft_missed, w.num_itl_missed, w.num_failed,
             w.max_ready) for w in miss_windows(r, TTFT_SLO_S, ITL_SLO_S, 0.0, 5.0, 2.0)]
    # the TTFT and ITL at their targets (AT_SLO) are met; a window without a decision
    # carries the last one's count, not the most of the window before; the last window
    # is the shorter remainder [4, 5)
    assert rows == [(0.0, 2, 0, 0, 0, 3), (2.0, 2, 1, 0, 1, 1), (4.0, 1, 0, 1, 0, 2)]
    missed = sum(w.num_missed for w in miss_windows(r, TTFT_SLO_S, ITL_SLO_S, 0.0, 5.0, 2.0))
    attainment = summarize("x", r, TTFT_SLO_S, ITL_SLO_S, 0.0, 5.0).slo_attainment
    assert attainment == pytest.approx(1 - missed / 5)  # the summary's rule, request by request
    r.timeline = [(-1.0, 2, 1)]
    assert [w.max_ready for w in miss_windows(r, TTFT_SLO_S, ITL_SLO_S, 0.0, 5.0, 2.0)] == [
        1, 1, 1]
    with pytest.raises(ValueError, match="the window must be > 0 s, got 0"):
        miss_windows(r, TTFT_SLO_S, ITL_SLO_S, 0.0, 5.0, 0.0)
