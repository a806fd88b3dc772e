"""Scheduler decisions with injected time: budget, chunks, priority, aging, margin, preemption."""

import pytest
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.kv_cache import KVCacheManager
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.scheduler import Scheduler, waiting_key
from kvfleet_engine.core.sequence import Request, RequestStatus


def make(config):
    kv = KVCacheManager(config.num_blocks, config.block_size,
                        enable_caching=config.enable_prefix_caching)
    return Scheduler(config, kv)


def req(rid, n, *, priority=0, arrival=0.0, first=1):
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=50),
                   priority=priority, arrival_time=arrival)


def finish_step(sched, out):
    """What the engine does after the runner: advance, cache, sample one token."""
    for r, n in out.scheduled:
        r.num_computed_tokens += n
        sched.kv_cache.cache_computed_blocks(r)
        if r.num_computed_tokens == r.num_tokens:
            r.append_output(7)


def plan(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_token_budget_splits_across_requests_and_chunks_the_last():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=16,
                          max_model_len=128)
    sched = make(config)
    for i, n in enumerate((10, 10, 10)):
        sched.add(req(f"r{i}", n, arrival=i, first=100 * i))
    out = sched.schedule(now=0.0)
    assert plan(out) == [("r0", 10), ("r1", 6)]
    assert out.num_batched_tokens == 16
    finish_step(sched, out)
    # r0 decodes 1; r1 finishes its prompt (4); r2 gets the rest of the budget
    assert plan(sched.schedule(now=1.0)) == [("r0", 1), ("r1", 4), ("r2", 10)]


def test_chunked_prefill_then_decode_share_one_path():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=16,
                          max_model_len=128)
    sched = make(config)
    r = req("long", 40)
    sched.add(r)
    sizes = []
    for step in range(5):
        out = sched.schedule(now=float(step))
        sizes.append(plan(out)[0][1])
        finish_step(sched, out)
    assert sizes == [16, 16, 8, 1, 1]
    assert r.num_output_tokens == 3
    assert len(r.block_ids) == 11  # 42 tokens in blocks of 4 (one slot left free)


def test_long_prefill_threshold_caps_one_request_per_step():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64,
                          max_model_len=128, long_prefill_token_threshold=8)
    sched = make(config)
    sched.add(req("a", 30))
    sched.add(req("b", 5, arrival=1, first=500))
    assert plan(sched.schedule(now=0.0)) == [("a", 8), ("b", 5)]


def test_max_num_seqs_limits_running_requests():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2,
                          max_num_batched_tokens=100, max_model_len=128)
    sched = make(config)
    for i in range(3):
        sched.add(req(f"r{i}", 3, arrival=i, first=10 * i))
    assert plan(sched.schedule(now=0.0)) == [("r0", 3), ("r1", 3)]
    assert sched.num_waiting == 1 and len(sched.running) == 2


def test_lower_priority_value_first_then_older_first():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1,
                          max_num_batched_tokens=100, max_model_len=128, aging_seconds=None)
    sched = make(config)
    sched.add(req("late-urgent", 3, priority=0, arrival=5.0))
    sched.add(req("early-batch", 3, priority=1, arrival=0.0))
    sched.add(req("early-urgent", 3, priority=0, arrival=1.0, first=50))
    order = []
    for step in range(3):
        out = sched.schedule(now=10.0 + step)
        order += [r.request_id for r, _ in out.scheduled if r.num_computed_tokens == 0]
        for r, _ in out.scheduled:  # finish at once to free the single slot
            sched.kv_cache.free(r)
            sched.remove(r)
        sched.remove_finished_running()
    assert order == ["early-urgent", "late-urgent", "early-batch"]


def test_waiting_key_ages_one_class_per_aging_period():
    config = EngineConfig(aging_seconds=10.0)
    # priority 1 at t=0 ranks with priority 0 at t=10
    assert waiting_key(config, 1, 0.0)[0] == waiting_key(config, 0, 10.0)[0]
    assert waiting_key(config, 1, 0.0) < waiting_key(config, 0, 10.5)
    assert waiting_key(config, 1, 0.0) > waiting_key(config, 0, 9.5)


def test_aging_lets_a_low_priority_request_through_a_stream_of_urgent_ones():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1,
                          max_num_batched_tokens=100, max_model_len=128, aging_seconds=10.0)
    sched = make(config)
    sched.add(req("batch", 3, priority=2, arrival=0.0, first=900))
    served_at = None
    for t in range(60):  # one urgent request arrives every second, one slot
        sched.add(req(f"u{t}", 3, priority=0, arrival=float(t), first=t))
        out = sched.schedule(now=float(t))
        for r, _ in out.scheduled:
            if r.request_id == "batch":
                served_at = t
            sched.kv_cache.free(r)
            sched.remove(r)
        sched.remove_finished_running()
        if served_at is not None:
            break
    # it outranks urgent arrivals after 2 classes x 10 s
    assert served_at is not None and 18 <= served_at <= 22


def test_without_aging_strict_priority_starves():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1,
                          max_num_batched_tokens=100, max_model_len=128, aging_seconds=None)
    sched = make(config)
    sched.add(req("batch", 3, priority=2, arrival=0.0, first=900))
    for t in range(40):
        sched.add(req(f"u{t}", 3, priority=0, arrival=float(t), first=t))
        out = sched.schedule(now=float(t))
        assert [r.request_id for r, _ in out.scheduled] == [f"u{t}"]
        for r, _ in out.scheduled:
            sched.kv_cache.free(r)
            sched.remove(r)
        sched.remove_finished_running()


def test_admission_keeps_the_safety_margin_but_running_requests_may_use_it():
    # 20 usable blocks of 4; margin 0.25 -> 5 blocks kept free at admission
    config = EngineConfig(num_blocks=21, block_size=4, max_num_batched_tokens=200,
                          max_model_len=80, kv_safety_margin=0.25, enable_prefix_caching=False)
    sched = make(config)
    sched.add(req("a", 40))  # 10 blocks
    sched.add(req("b", 24, arrival=1, first=100))  # 6 blocks: 10 + 6 > 20 - 5
    out = sched.schedule(now=0.0)
    assert plan(out) == [("a", 40)]
    assert sched.kv_cache.num_free_blocks == 10
    finish_step(sched, out)
    assert plan(sched.schedule(now=1.0)) == [("a", 1)]  # b still waits: 10 - 6 < 5
    sched2 = make(config)
    sched2.add(req("c", 20))  # 5 blocks, leaves 15 >= 5: admitted
    sched2.add(req("d", 20, arrival=1, first=100))  # leaves 10 >= 5: admitted
    assert plan(sched2.schedule(now=0.0)) == [("c", 20), ("d", 20)]


def test_a_lone_request_is_admitted_even_inside_the_margin():
    config = EngineConfig(num_blocks=11, block_size=4, max_num_batched_tokens=200,
                          max_model_len=40, kv_safety_margin=0.5)
    sched = make(config)
    sched.add(req("big", 36))  # 9 of 10 blocks: only possible with nothing else running
    assert plan(sched.schedule(now=0.0)) == [("big", 36)]


def test_preemption_takes_lowest_priority_then_newest_and_requeues_it():
    # 7 usable blocks of 2 tokens
    config = EngineConfig(num_blocks=8, block_size=2, max_num_batched_tokens=100,
                          max_model_len=12, kv_safety_margin=0.0, enable_prefix_caching=False)
    sched = make(config)
    sched.add(req("old-low", 4, priority=1, arrival=0.0, first=10))
    sched.add(req("new-high", 4, priority=0, arrival=2.0, first=20))
    sched.add(req("new-low", 4, priority=1, arrival=1.0, first=30))
    out = sched.schedule(now=3.0)
    assert plan(out) == [("new-high", 4)]  # the less important ones wait one step
    finish_step(sched, out)  # new-high now has 5 tokens: its 5th needs a third block
    out = sched.schedule(now=3.5)
    assert plan(out) == [("new-high", 1), ("old-low", 4), ("new-low", 4)]
    assert sched.kv_cache.num_free_blocks == 0
    finish_step(sched, out)  # the low ones now have 5 tokens: each needs a third block
    out = sched.schedule(now=4.0)
    assert [r.request_id for r in out.preempted] == ["new-low"]
    assert plan(out) == [("new-high", 1), ("old-low", 1)]
    low = out.preempted[0]
    assert low.status is RequestStatus.WAITING and low.num_computed_tokens == 0
    assert low.block_ids == [] and low.num_output_tokens == 1 and low.num_preemptions == 1
    assert sched.num_preemptions == 1 and sched.num_waiting == 1
    # no admission in a step that preempted, and the victim recomputes prompt + output later
    assert "new-low" not in [r.request_id for r, _ in out.scheduled]


def test_a_request_preempts_itself_when_it_is_the_least_important():
    config = EngineConfig(num_blocks=5, block_size=2, max_num_batched_tokens=100,
                          max_model_len=8, kv_safety_margin=0.0, enable_prefix_caching=False)
    sched = make(config)
    sched.add(req("high", 2, priority=0, arrival=1.0))
    sched.add(req("low", 4, priority=5, arrival=0.0, first=40))
    out = sched.schedule(now=0.0)
    assert plan(out) == [("high", 2)]  # low waits a step (a less important prefill)
    finish_step(sched, out)
    out = sched.schedule(now=0.5)
    assert plan(out) == [("high", 1), ("low", 4)]
    finish_step(sched, out)  # all 4 blocks used; only low's next token needs a new one
    out = sched.schedule(now=1.0)
    assert [r.request_id for r in out.preempted] == ["low"]
    assert plan(out) == [("high", 1)]


def test_waiting_prompt_tokens_count_uncached_tokens_and_leave_on_abort():
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1,
                          max_num_batched_tokens=100, max_model_len=128)
    sched = make(config)
    first = req("a", 9)
    sched.add(first)
    finish_step(sched, sched.schedule(now=0.0))  # a's 2 full blocks are cached
    same_prefix = Request("b", list(range(1, 9)) + [99, 98], SamplingParams())
    sched.add(same_prefix)
    other = req("c", 5, first=500)
    sched.add(other)
    assert sched.num_waiting == 2
    assert sched.num_waiting_prompt_tokens == (10 - 8) + 5
    sched.remove(other)
    assert sched.num_waiting == 1 and sched.num_waiting_prompt_tokens == 2


@pytest.mark.parametrize("bad, message", [
    (dict(block_size=0), "block_size"),
    (dict(num_blocks=1), "num_blocks"),
    (dict(kv_safety_margin=1.0), "kv_safety_margin"),
    (dict(aging_seconds=0), "aging_seconds"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(num_blocks=4, block_size=4, max_model_len=100), "does not fit"),
])
def test_config_rejects_bad_values(bad, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**bad)


def seats_config(**kw):
    return EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2,
                        max_num_batched_tokens=100, max_model_len=64, **kw)


def test_a_more_important_request_takes_the_seat_of_the_least_important_one():
    sched = make(seats_config())
    sched.add(req("low-old", 4, priority=1, arrival=0.0, first=10))
    sched.add(req("low-new", 4, priority=1, arrival=0.5, first=20))
    finish_step(sched, sched.schedule(now=1.0))  # both seats taken, both decoding
    sched.add(req("high", 4, priority=0, arrival=1.0, first=30))
    out = sched.schedule(now=1.0)
    assert [r.request_id for r in out.preempted] == ["low-new"]
    assert plan(out) == [("low-old", 1), ("high", 4)]  # the victim's token went to "high"
    victim = out.preempted[0]
    assert victim.status is RequestStatus.WAITING and victim.num_computed_tokens == 0
    assert sched.num_waiting == 1


def test_no_seat_is_taken_at_equal_priority_or_from_a_request_aging_made_first():
    sched = make(seats_config())
    sched.add(req("a", 4, priority=0, arrival=0.0, first=10))
    sched.add(req("b", 4, priority=0, arrival=0.5, first=20))
    finish_step(sched, sched.schedule(now=1.0))
    sched.add(req("c", 4, priority=0, arrival=1.0, first=30))
    out = sched.schedule(now=1.0)
    assert out.preempted == [] and "c" not in [r for r, _ in plan(out)]
    # aging 10 s per class: a priority-1 request that arrived at 0 has key 10; a priority-0
    # one arriving at 10 has key 10 too, not earlier: no seat; arriving at 9.9, it takes one
    for arrival, expect in ((10.0, []), (9.9, ["old-low"])):
        sched = make(seats_config())
        sched.add(req("old-low", 4, priority=1, arrival=0.0, first=10))
        sched.add(req("filler", 4, priority=0, arrival=0.0, first=20))
        for _ in range(2):  # filler is seated first, old-low a step later
            finish_step(sched, sched.schedule(now=0.0))
        assert {r.request_id for r in sched.running} == {"old-low", "filler"}
        sched.add(req("urgent", 4, priority=0, arrival=arrival, first=30))
        out = sched.schedule(now=arrival)
        assert [r.request_id for r in out.preempted] == expect, arrival


def test_seats_are_not_taken_when_preempt_for_priority_is_off():
    sched = make(seats_config(preempt_for_priority=False))
    sched.add(req("low-old", 4, priority=1, arrival=0.0, first=10))
    sched.add(req("low-new", 4, priority=1, arrival=0.5, first=20))
    finish_step(sched, sched.schedule(now=1.0))
    sched.add(req("high", 4, priority=0, arrival=1.0, first=30))
    out = sched.schedule(now=1.0)
    assert out.preempted == [] and plan(out) == [("low-old", 1), ("low-new", 1)]


def test_a_step_that_admits_a_request_admits_no_less_important_one_after_it():
    """The flood's prefill waits one step instead of slowing the critical first token."""
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=4,
                          max_num_batched_tokens=100, max_model_len=64)
    sched = make(config)
    sched.add(req("high", 8, priority=-1, arrival=1.0, first=10))
    sched.add(req("flood", 8, priority=0, arrival=0.0, first=20))
    sched.add(req("high-too", 8, priority=-1, arrival=1.5, first=40))
    out = sched.schedule(now=2.0)
    assert plan(out) == [("high", 8), ("high-too", 8)]  # equal priority still shares
    finish_step(sched, out)
    assert plan(sched.schedule(now=2.1)) == [("high", 1), ("high-too", 1), ("flood", 8)]
    # one priority: everything that fits is admitted together, as before
    same = make(config)
    for i in range(3):
        same.add(req(f"r{i}", 8, arrival=float(i), first=100 + 10 * i))
    assert [rid for rid, _ in plan(same.schedule(now=5.0))] == ["r0", "r1", "r2"]
