"""The fast paths the simulator relies on keep the behaviour of the slow ones."""

import enum

import pytest
from kvfleet_engine.core.request_checks import check_request
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock
from kvfleet_router.prefix_index import ApproxPrefixIndex


class Tok(enum.IntEnum):
    A = 3


def check(prompt, vocab=100):
    check_request("r", prompt, SamplingParams(max_tokens=1), 0, max_model_len=1000,
                  vocab_size=vocab, has_tokenizer=False)


@pytest.mark.parametrize("bad", [[1, True], [1, 2.0], [1, -1], [1, 100], [1, "a"]])
def test_token_checks_refuse_what_they_always_refused(bad):
    with pytest.raises(ValueError, match="prompt token id"):
        check(bad)


def test_token_checks_accept_ints_and_int_subclasses():
    check([0, 99, 5])
    check([1, Tok.A])
    check([10**6], vocab=None)


def test_runner_without_kv_check_takes_the_same_time():
    from kvfleet_engine.core.config import EngineConfig
    from kvfleet_engine.core.engine import LLMEngine

    ends = []
    for check_kv in (True, False):
        clock = VirtualClock()
        runner = SimulatedRunner("h100-llama3-8b", num_blocks=512, block_size=16,
                                 time_mode="virtual", clock=clock, check_kv=check_kv)
        engine = LLMEngine(EngineConfig(num_blocks=512, block_size=16), runner,
                           tokenizer=None, eos_token_ids=(), clock=clock)
        for i in range(3):
            engine.add_request(f"r{i}", list(range(1, 200 + i)),
                               SamplingParams(max_tokens=20, ignore_eos=True))
        n = 0
        while engine.has_unfinished_requests():
            n += sum(len(o.new_token_ids) for o in engine.step())
        ends.append((clock.now_s, n))
    assert ends[0] == ends[1] and ends[0][1] == 60


def test_index_keeps_owner_sets_right_through_sharing_and_eviction():
    idx = ApproxPrefixIndex(block_bytes=1, max_blocks_per_endpoint=3)
    idx.record("a", [1, 2, 3])
    idx.record("b", [1, 2])
    assert idx.match([1, 2, 3]) == {"a": 3, "b": 2}
    idx.record("a", [7])  # a's LRU was 3, 2, 1 (tail first); 3 goes
    assert idx.match([1, 2, 3]) == {"a": 2, "b": 2}
    idx.forget_endpoint("b")
    assert idx.match([1, 2]) == {"a": 2} and idx.match([7]) == {"a": 1}
    idx.remove("a", [1, 2, 3, 7])
    assert idx.match([1]) == {} and idx._owners == {}
