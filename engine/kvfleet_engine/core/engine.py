"""The step loop: scheduler -> runner -> outputs, one step per `step()` call.

API (the server, the simulator and `LLM` drive exactly this; not thread-safe, so call
it from one thread, e.g. the server's engine thread):

    engine = LLMEngine(EngineConfig(...), runner, tokenizer=None, eos_token_ids=None,
                       clock=time.monotonic)   # eos None: the tokenizer's; (): none
    engine.add_request(request_id, prompt_token_ids, SamplingParams(...), priority=0,
                       arrival_time=None, hold_kv=False, preloaded_kv=None,
                       prefix_kv=None) -> PrefixInstall
        ValueError with a one-line reason for bad input: empty prompt, bad token ids,
        prompt + max_tokens > max_model_len, duplicate id, stop strings without a
        tokenizer, a preload of the wrong size. Lower priority values run first.
    engine.export_prefix(block_hashes, max_blocks) -> ExportedPrefix
    engine.abort_request(request_id) -> bool       frees blocks now; the next step()
        returns a final output with finish_reason "abort"
    engine.step() -> list[RequestOutput]           one output per request that got a
        token (or finished) in this step; chunks of a prompt produce none
    engine.has_unfinished_requests() -> bool
    engine.stats() -> EngineStats                  a snapshot, cheap enough per step
    engine.drain_kv_events() -> list[KVEvent]      BlockStored/BlockRemoved; seq +1 each

RequestOutput: request_id, new_token_ids, token_ids (all output so far), new_text/text
(with a tokenizer: incremental detokenization, stop strings cut the text and finish with
"stop"), is_finished, finish_reason ("stop"|"length"|"abort"|None), num_prompt_tokens,
num_cached_tokens, timing (arrival, first_scheduled, first_token, last_token, finished,
all from `clock`).

Prefill/decode hooks:
- hold_kv=True: on finish the request's blocks are not freed; they stay under its id
  (`get_held_blocks`, `get_held_num_tokens`) until `release_held` (or abort_request).
- preloaded_kv=PreloadedKV(num_tokens, data): at admission the engine allocates blocks
  for the first num_tokens prompt tokens, calls runner.write_blocks, and counts them as
  computed (no prefix-cache query or hit is recorded). At least the last prompt token is
  computed here, so the sampled token is the one unified serving would give.

Peer prefix sharing (`core/prefix_share.py`):
- prefix_kv=PrefixKV(block_hashes, data): blocks fetched from a peer's prefix cache. At
  add time the engine keeps the leading blocks whose hashes equal the prompt's own chained
  hashes, writes them into fresh blocks (reusing any it caches already), registers them as
  prefix-cache entries and pins them until the request is admitted; the scheduler's
  ordinary prefix-cache hit then uses them (and counts them as hits). Nothing here fails
  the request: no room, or bytes the runner refuses, install nothing (see the returned
  PrefixInstall) and the prompt is computed.
- export_prefix: the longest leading run of the given hashes still cached, with its KV
  bytes, read in one call so nothing is evicted in between.

Per-step wall-clock timings (schedule / execute / postprocess) are in stats().timings,
so a benchmark can measure the engine's own overhead against the runner's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from kvfleet_engine.contract import KVEvent
from kvfleet_engine.core import prefix_share
from kvfleet_engine.core.block_pool import KVBlock
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.kv_cache import KVCacheManager
from kvfleet_engine.core.output_processor import IncrementalDetokenizer, check_stop_token
from kvfleet_engine.core.outputs import EngineStats, RequestOutput, StepTimings
from kvfleet_engine.core.prefix_share import ExportedPrefix, PrefixInstall
from kvfleet_engine.core.request_checks import bytes_per_block, check_preload, check_request
from kvfleet_engine.core.runner_base import Runner, ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.scheduler import Scheduler
from kvfleet_engine.core.sequence import PrefixKV, PreloadedKV, Request, RequestStatus


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        tokenizer: Any = None,
        eos_token_ids: Collection[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if runner.block_size != config.block_size:
            raise ValueError(
                f"runner block_size {runner.block_size} != config block_size {config.block_size}"
            )
        if runner.num_blocks < config.num_blocks:
            raise ValueError(
                f"runner has {runner.num_blocks} KV blocks, config asks for {config.num_blocks}"
            )
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        if eos_token_ids is None:  # None: the tokenizer's; () means no EOS at all
            eos_token_ids = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = frozenset(eos_token_ids)
        self._clock = clock
        self.kv_cache = KVCacheManager(
            config.num_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            clock=clock,
            max_pending_events=config.max_pending_kv_events,
        )
        self.scheduler = Scheduler(config, self.kv_cache)
        self._requests: dict[str, Request] = {}  # waiting or running
        self._held: dict[str, Request] = {}  # finished with hold_kv, blocks still owned
        self._pending: list[RequestOutput] = []  # abort outputs for the next step()
        # installed peer prefixes, pinned until their waiting request is admitted
        self._pins: dict[str, tuple[Request, list[KVBlock]]] = {}
        self._num_pinned = 0
        # Entered around each forward pass. The server's engine thread releases its
        # bookkeeping lock there, so a peer's export reads cached blocks while a step computes.
        self.forward_gate: AbstractContextManager[Any] = nullcontext()
        self.is_last_step_idle = False  # the last step() found nothing it could run
        self._timings = StepTimings()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._vocab_size: int | None = getattr(runner, "vocab_size", None)

    # --- requests in ---

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        hold_kv: bool = False,
        preloaded_kv: PreloadedKV | None = None,
        prefix_kv: PrefixKV | None = None,
    ) -> PrefixInstall:
        check_request(
            request_id,
            prompt_token_ids,
            params,
            priority,
            max_model_len=self.config.max_model_len,
            vocab_size=self._vocab_size,
            has_tokenizer=self.tokenizer is not None,
        )
        if request_id in self._requests or request_id in self._held:
            raise ValueError(f"request id {request_id!r} is already in use")
        if preloaded_kv is not None:
            check_preload(
                preloaded_kv,
                len(prompt_token_ids),
                self.config.block_size,
                bytes_per_block(*self.runner.kv_block_shape()),
            )
        request = Request(
            request_id,
            list(prompt_token_ids),
            params,
            priority=priority,
            arrival_time=self._clock() if arrival_time is None else arrival_time,
            hold_kv=hold_kv,
            preloaded_kv=preloaded_kv,
        )
        if self.tokenizer is not None:
            request.detokenizer = IncrementalDetokenizer(self.tokenizer, params.stop)
        installed = PrefixInstall()
        if prefix_kv is not None and preloaded_kv is None:
            installed = self._install_prefix(request, prefix_kv)
        self._requests[request_id] = request
        self.scheduler.add(request)
        return installed

    def _install_prefix(self, request: Request, prefix: PrefixKV) -> PrefixInstall:
        config = self.config
        installed, pinned = prefix_share.install(
            self.kv_cache, self.runner, request, prefix,
            num_reserved=config.num_margin_blocks,
            max_pinned=config.num_usable_blocks // 2 - self._num_pinned,
        )
        if pinned:
            self._pins[request.request_id] = (request, pinned)
            self._num_pinned += len(pinned)
        return installed

    def _unpin(self, request_id: str) -> None:
        _, pinned = self._pins.pop(request_id)
        self._num_pinned -= len(pinned)
        self.kv_cache.pool.free(pinned)

    def _unpin_admitted(self) -> None:
        for request_id, (request, _) in list(self._pins.items()):
            if request.status is not RequestStatus.WAITING:
                self._unpin(request_id)

    def export_prefix(self, block_hashes: Sequence[int], max_blocks: int) -> ExportedPrefix:
        """The cached leading run of `block_hashes` (at most max_blocks) and its KV bytes."""
        run = prefix_share.export_run(self.kv_cache.pool, block_hashes, max_blocks)
        data = self.runner.read_blocks([b.block_id for b in run]) if run else b""
        tokens = [t for b in run for t in b.tokens()]
        return ExportedPrefix([h for b in run if (h := b.block_hash) is not None], tokens, data)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks now. False when the id is unknown."""
        request = self._requests.pop(request_id, None)
        if request is None:
            if request_id in self._held:
                self.release_held(request_id)
                return True
            return False
        if request_id in self._pins:
            self._unpin(request_id)
        was_running = request.status is RequestStatus.RUNNING
        self.scheduler.remove(request)
        if request.block_ids:
            self.kv_cache.free(request)
        if was_running or request.num_preemptions:
            self.runner.release(request_id)
        request.finish_reason = "abort"
        request.timing.finished_time = self._clock()
        self._pending.append(self._output(request, [], "", True))
        return True

    # --- the step ---

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule(self._clock())
        if self._pins:  # admitted requests now hold their own references
            self._unpin_admitted()
        scheduled = sched.scheduled
        timings = self._timings
        # Nothing runnable (e.g. held KV fills the cache): the driver may wait, not spin.
        self.is_last_step_idle = not scheduled
        if not scheduled:
            timings.last_schedule_s = time.perf_counter() - t0
            timings.schedule_s += timings.last_schedule_s
            return outputs
        runner = self.runner
        if sched.preloads:
            scheduled = self._write_preloads(sched.preloads, scheduled, outputs)
            if not scheduled:
                return outputs
        seqs = []
        for request, n in scheduled:
            start = request.num_computed_tokens
            end = start + n
            seqs.append(
                ScheduledSeq(
                    request.request_id,
                    request.all_token_ids[start:end],
                    start,
                    request.block_ids,
                    end == len(request.all_token_ids),
                    request.params,
                    len(request.output_token_ids),
                    request.num_cached_tokens,
                )
            )
        t1 = time.perf_counter()
        with self.forward_gate:
            sampled = runner.execute(StepBatch(seqs))
        t2 = time.perf_counter()
        self._process(scheduled, sampled, outputs)
        t3 = time.perf_counter()
        timings.num_steps += 1
        timings.last_schedule_s = t1 - t0
        timings.last_execute_s = t2 - t1
        timings.last_postprocess_s = t3 - t2
        timings.schedule_s += t1 - t0
        timings.execute_s += t2 - t1
        timings.postprocess_s += t3 - t2
        timings.last_num_seqs = len(seqs)
        timings.last_num_tokens = sched.num_batched_tokens
        return outputs

    def _write_preloads(
        self,
        preloads: list[tuple[Request, list[int], bytes]],
        scheduled: list[tuple[Request, int]],
        outputs: list[RequestOutput],
    ) -> list[tuple[Request, int]]:
        """Install transferred KV; a payload the runner rejects aborts only its request."""
        failed: set[str] = set()
        for request, block_ids, data in preloads:
            try:
                self.runner.write_blocks(block_ids, data)
            except (ValueError, RuntimeError):
                failed.add(request.request_id)
        if not failed:
            return scheduled
        for request_id in failed:
            self.abort_request(request_id)
        outputs += self._pending
        self._pending = []
        return [(r, n) for r, n in scheduled if r.request_id not in failed]

    def _process(
        self,
        scheduled: list[tuple[Request, int]],
        sampled: dict[str, int],
        outputs: list[RequestOutput],
    ) -> None:
        now = self._clock()
        kv = self.kv_cache
        is_caching = kv.enable_caching
        bs = self.config.block_size
        eos = self.eos_token_ids
        max_model_len = self.config.max_model_len
        num_finished = 0
        self._num_generation_tokens += len(sampled)
        for request, n in scheduled:
            num_computed = request.num_computed_tokens + n
            request.num_computed_tokens = num_computed
            if is_caching and num_computed // bs > request.num_hashed_blocks:
                kv.cache_computed_blocks(request)
            all_ids = request.all_token_ids
            if num_computed < len(all_ids):
                continue  # a prompt chunk: nothing to report yet
            token = sampled.get(request.request_id)
            if token is None:
                raise RuntimeError(f"runner returned no token for {request.request_id!r}")
            timing = request.timing
            if timing.first_token_time is None:
                timing.first_token_time = now
                self._num_prompt_tokens += len(request.prompt_token_ids)
            timing.last_token_time = now
            output_ids = request.output_token_ids
            output_ids.append(token)
            all_ids.append(token)
            params = request.params
            if (
                len(output_ids) < params.max_tokens
                and token not in eos
                and not params.stop_token_ids
                and len(all_ids) < max_model_len
            ):
                reason = None  # the common case, decided without a call
            else:
                reason = check_stop_token(
                    token, len(output_ids), len(all_ids), params, eos, max_model_len
                )
            new_text = ""
            detok = request.detokenizer
            if detok is not None:
                new_text, is_stopped = detok.add(
                    None if reason == "stop" else token, is_final=reason is not None
                )
                if is_stopped:
                    reason = "stop"
            if reason is not None:
                self._finish(request, reason, now)
                num_finished += 1
            if detok is None:
                outputs.append(
                    RequestOutput(
                        request.request_id, [token], output_ids, "", "", 0, reason is not None,
                        reason, len(request.prompt_token_ids), request.num_cached_tokens, timing,
                    )
                )
            else:
                outputs.append(self._output(request, [token], new_text, reason is not None))
        if num_finished:
            self.scheduler.remove_finished_running()

    def _finish(self, request: Request, reason: str, now: float) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.timing.finished_time = now
        del self._requests[request.request_id]
        if request.hold_kv:
            self._held[request.request_id] = request
        else:
            self.kv_cache.free(request)
        self.runner.release(request.request_id)

    @staticmethod
    def _output(
        request: Request, new_token_ids: list[int], new_text: str, is_finished: bool
    ) -> RequestOutput:
        detok = request.detokenizer
        return RequestOutput(
            request.request_id,
            new_token_ids,
            request.output_token_ids,
            new_text,
            "" if detok is None else detok.text,
            0 if detok is None else detok.num_sent,
            is_finished,
            request.finish_reason if is_finished else None,
            len(request.prompt_token_ids),
            request.num_cached_tokens,
            request.timing,
        )

    # --- state out ---

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def stats(self) -> EngineStats:
        sched = self.scheduler
        kv = self.kv_cache
        return EngineStats(
            num_running=len(sched.running),
            num_waiting=sched.num_waiting,
            kv_usage=kv.usage(),
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=sched.num_preemptions,
            num_waiting_prompt_tokens=sched.num_waiting_prompt_tokens,
            num_gpu_blocks=self.config.num_blocks,
            block_size=self.config.block_size,
            num_held=len(self._held),
            num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            timings=self._timings.snapshot(),
        )

    def drain_kv_events(self) -> list[KVEvent]:
        return self.kv_cache.drain_events()

    # --- prefill/decode hooks ---

    def get_held_blocks(self, request_id: str) -> list[int]:
        return list(self._held_request(request_id).block_ids)

    def get_held_num_tokens(self, request_id: str) -> int:
        """Tokens whose KV the held blocks contain (the prompt, plus outputs but the last)."""
        return self._held_request(request_id).num_computed_tokens

    def release_held(self, request_id: str) -> None:
        request = self._held_request(request_id)
        del self._held[request_id]
        self.kv_cache.free(request)

    def _held_request(self, request_id: str) -> Request:
        request = self._held.get(request_id)
        if request is None:
            raise KeyError(f"no KV is held for request {request_id!r}")
        return request
