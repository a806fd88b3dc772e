"""A runner that computes nothing and takes its time from a cost model.

It keeps a pseudo KV cache so the scheduler's block bookkeeping is really exercised:
each slot holds a rolling 64-bit hash of the tokens up to that position, computed from
the previous position's slot through the block table (the way attention reads the
cache). A sampled token is a function of the last slot, so outputs depend on what the
blocks hold: a wrong prefix hit or a block shared by mistake changes the tokens. Only
the previous slot is read (O(1) per token); since it chains over all earlier tokens, a
wrong block anywhere before the point where computing resumes still shows.
`check_kv=False` (the fleet simulator, which replays millions of prompt tokens and ignores
the outputs) skips the pseudo KV: each sampled token is then a function of the request's
last token and position only, O(1) per sequence.

Time, per `time_mode`:
- "report":  only report the step's duration (`last_step_s`), for callers that keep time;
- "virtual": advance a `VirtualClock` by it (simulator and tests, no sleeping);
- "sleep":   really sleep it (the server, to look like the profiled hardware).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable

from kvfleet_engine.core.runner_base import StepBatch
from kvfleet_engine.runners.cost_model import CostProfile, load_profile, step_time

_MASK = (1 << 64) - 1
_SEED = 0x243F6A8885A308D3
_TIME_MODES = ("report", "virtual", "sleep")


class VirtualClock:
    """A clock that only moves when told; pass it as the engine's `clock`."""

    __slots__ = ("now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def _mix(h: int, token: int, pos: int) -> int:
    h = ((h ^ (token * 0x9E3779B97F4A7C15 + pos)) * 0xBF58476D1CE4E5B9) & _MASK
    return h ^ (h >> 31)


class SimulatedRunner:
    def __init__(
        self,
        profile: CostProfile | str = "cpu-tiny",
        *,
        num_blocks: int | None = None,
        block_size: int | None = None,
        vocab_size: int | None = None,
        time_mode: str = "report",
        clock: VirtualClock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
        check_kv: bool = True,
    ) -> None:
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.check_kv = check_kv
        if time_mode not in _TIME_MODES:
            raise ValueError(f"time_mode must be one of {_TIME_MODES}, not {time_mode!r}")
        if time_mode == "virtual" and clock is None:
            raise ValueError('time_mode "virtual" needs a VirtualClock')
        self.num_blocks = num_blocks or self.profile.num_gpu_blocks
        self.block_size = block_size or self.profile.block_size
        self.vocab_size = vocab_size or self.profile.vocab_size
        self.time_mode = time_mode
        self.clock = clock
        self._sleep = sleep
        self.seed = seed  # for sampled (non-greedy) requests that bring no seed of their own
        # One value per KV slot, to check the scheduler's block tables; without the check
        # (the simulator) no value is ever written, so none is stored.
        self._kv = [0] * (self.num_blocks * self.block_size) if check_kv else []
        self.last_step_s = 0.0
        self.total_step_s = 0.0
        self.num_steps = 0

    def execute(self, batch: StepBatch) -> dict[str, int]:
        started = time.perf_counter()
        kv = self._kv
        bs = self.block_size
        sampled: dict[str, int] = {}
        for seq in batch.seqs:
            if not self.check_kv:
                if seq.do_sample:
                    end = seq.start_pos + len(seq.token_ids)
                    h = _mix(_SEED, seq.token_ids[-1], end)
                    sampled[seq.request_id] = (h >> 11) % self.vocab_size
                continue
            table = seq.block_table
            pos = seq.start_pos
            if pos == 0:
                h = _SEED
            else:
                prev = pos - 1
                h = kv[table[prev // bs] * bs + prev % bs]
            for token in seq.token_ids:
                h = _mix(h, token, pos)
                kv[table[pos // bs] * bs + pos % bs] = h
                pos += 1
            if seq.do_sample:
                params = seq.params
                if not params.is_greedy:
                    seed = params.seed if params.seed is not None else self.seed
                    if seed is not None:
                        h = _mix(h, seed, seq.num_output_tokens)
                sampled[seq.request_id] = (h >> 11) % self.vocab_size
        duration = step_time(self.profile, batch)
        self.last_step_s = duration
        self.total_step_s += duration
        self.num_steps += 1
        if self.time_mode == "virtual":
            assert self.clock is not None
            self.clock.advance(duration)
        elif self.time_mode == "sleep":
            remaining = duration - (time.perf_counter() - started)
            if remaining > 0:
                self._sleep(remaining)
        return sampled

    def release(self, request_id: str) -> None:
        """No per-request state to forget."""

    def kv_block_shape(self) -> tuple[str, list[int]]:
        return "uint64", [self.block_size]

    def read_blocks(self, block_ids: list[int]) -> bytes:
        bs = self.block_size
        out = array("Q")
        for b in block_ids:
            self._check_block(b)
            if self.check_kv:
                out.extend(self._kv[b * bs : (b + 1) * bs])
        if not self.check_kv:
            return bytes(out.itemsize * bs * len(block_ids))  # never written: zeros
        return out.tobytes()

    def write_blocks(self, block_ids: list[int], data: bytes) -> None:
        bs = self.block_size
        values = array("Q")
        if len(data) != len(block_ids) * bs * values.itemsize:
            raise ValueError(
                f"{len(data)} bytes do not fill {len(block_ids)} blocks of {bs} uint64 slots"
            )
        values.frombytes(data)
        for i, b in enumerate(block_ids):
            self._check_block(b)
            if self.check_kv:
                self._kv[b * bs : (b + 1) * bs] = values[i * bs : (i + 1) * bs].tolist()

    def _check_block(self, block_id: int) -> None:
        if not 0 < block_id < self.num_blocks:
            raise ValueError(f"block id {block_id} is out of range [1, {self.num_blocks})")


def build_simulated_runner(
    profile: str,
    num_blocks: int,
    block_size: int,
    *,
    seed: int | None = None,
    vocab_size: int | None = None,
    time_mode: str = "sleep",
) -> SimulatedRunner:
    """The server's simulated runner: sleeps each step for the profile's time."""
    return SimulatedRunner(
        profile,
        num_blocks=num_blocks,
        block_size=block_size,
        vocab_size=vocab_size,
        time_mode=time_mode,
        seed=seed,
    )
