"""One scheduling decision per step, over one token budget.

Every request, running or waiting, asks for `num_tokens - num_computed_tokens`: a whole
prompt, a chunk of it (chunked prefill), the rest after a prefix-cache hit, or one token
of decode. There is no prefill/decode split; all share the loop below.

1. Running requests go first, most important first (priority, then arrival). When one
   cannot get blocks, the least important one still unscheduled in this step (lowest
   priority, newest) is preempted by recompute: its blocks are freed and it rejoins the
   waiting queue with its progress reset. It may be the request itself.
2. Then, if nothing was preempted, waiting requests are admitted in order while the
   budget, `max_num_seqs` and the KV safety margin allow. The head of the queue blocks
   the rest (no overtaking), so order is what the key below says. With every seat taken
   (`max_num_seqs`), a head that outranks the least important running request (a lower
   priority value and an earlier waiting key, so aging still protects it) takes its seat:
   that one is preempted by recompute (`preempt_for_priority`, vLLM's priority policy
   does the same), so a critical request never waits behind a batch of sheddable ones.
   A step that admits a request admits no less important one after it (a lower priority
   value stops the admissions): the first token of a critical request, or of a tenant
   the router lifted (its priority is its standing), is not slowed by a flood's prefill
   in the same step. That prefill waits one step; with one priority nothing changes.

Waiting order with aging: key = arrival_time + priority * aging_seconds, i.e. a request
of priority p counts as if it had arrived p * aging_seconds later. Since every waiting
request ages at the same rate, the key never changes, so the queue is a plain heap; and
a request is overtaken only by requests with a smaller key, so none starves.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.kv_cache import KVCacheManager, cdiv
from kvfleet_engine.core.sequence import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, num tokens)
    preempted: list[Request] = field(default_factory=list)
    preloads: list[tuple[Request, list[int], bytes]] = field(default_factory=list)
    num_batched_tokens: int = 0


def waiting_key(config: EngineConfig, priority: int, arrival_time: float) -> tuple[float, float]:
    """Pure: the order of the waiting queue (smaller first)."""
    if config.aging_seconds is None:
        return (float(priority), arrival_time)
    return (arrival_time + priority * config.aging_seconds, arrival_time)


def _running_key(request: Request) -> tuple[int, float, int]:
    return (request.priority, request.arrival_time, request.sort_key[2])


class Scheduler:
    def __init__(self, config: EngineConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.running: list[Request] = []  # sorted by _running_key
        self._waiting: list[tuple[tuple[float, float, int], Request]] = []  # heap, lazy deletes
        self._num_waiting = 0
        self._num_waiting_tokens = 0
        self._counter = itertools.count()
        self.num_preemptions = 0

    # --- queue management ---

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_waiting_prompt_tokens(self) -> int:
        """Uncached tokens of waiting requests (prefix hits estimated when they queued)."""
        return self._num_waiting_tokens

    def add(self, request: Request) -> None:
        k1, k2 = waiting_key(self.config, request.priority, request.arrival_time)
        request.sort_key = (k1, k2, next(self._counter))  # kept across preemptions
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        if request.preloaded_kv is not None:
            estimate = request.num_tokens - request.preloaded_kv.num_tokens
        else:
            estimate = request.num_tokens - self.kv_cache.get_computed_blocks(request)[1]
        request.num_uncached_estimate = max(estimate, 1)
        heapq.heappush(self._waiting, (request.sort_key, request))
        self._num_waiting += 1
        self._num_waiting_tokens += request.num_uncached_estimate

    def remove(self, request: Request) -> None:
        """Take a request out (finish or abort). Waiting ones leave the heap lazily."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self._num_waiting -= 1
            self._num_waiting_tokens -= request.num_uncached_estimate
        request.status = RequestStatus.FINISHED

    def remove_finished_running(self) -> None:
        """Drop finished requests from the running list in one pass."""
        self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]

    def _peek_waiting(self) -> Request | None:
        heap = self._waiting
        while heap:
            request = heap[0][1]
            if request.status is RequestStatus.WAITING:
                return request
            heapq.heappop(heap)  # finished/aborted while waiting
        return None

    # --- the decision ---

    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        cap = self.config.long_prefill_token_threshold
        kv = self.kv_cache
        running = self.running
        scheduled = out.scheduled
        bs = self.config.block_size

        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            num_computed = request.num_computed_tokens
            num_new = len(request.all_token_ids) - num_computed
            if cap and num_new > cap:
                num_new = cap
            if num_new > budget:
                num_new = budget
            if num_computed + num_new <= len(request.block_ids) * bs:
                scheduled.append((request, num_new))  # fast path: its blocks have room
                budget -= num_new
                i += 1
                continue
            is_self_preempted = False
            while kv.allocate_slots(request, num_new) is None:
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    is_self_preempted = True
                    break
            if is_self_preempted:
                break
            scheduled.append((request, num_new))
            budget -= num_new
            i += 1

        if not out.preempted:
            self._admit(out, budget, now)
        out.num_batched_tokens = sum(n for _, n in scheduled)
        return out

    def _admit(self, out: SchedulerOutput, budget: int, now: float) -> None:
        config = self.config
        kv = self.kv_cache
        cap = config.long_prefill_token_threshold
        bs = config.block_size
        admitted_priority: int | None = None  # the best priority admitted in this step
        while budget > 0:
            request = self._peek_waiting()
            if request is None:
                return
            if admitted_priority is not None and request.priority > admitted_priority:
                return  # its prefill would slow a more important one's first token
            if len(self.running) >= config.max_num_seqs:
                refund = self._free_seat_for(request, out)
                if refund is None:
                    return
                budget += refund
            preload = request.preloaded_kv
            if preload is not None:
                hits: list = []
                num_computed = min(preload.num_tokens, request.num_tokens - 1)
                num_preloaded_blocks = cdiv(preload.num_tokens, bs)
            else:
                hits, num_computed = kv.get_computed_blocks(request)
                num_preloaded_blocks = 0
            num_new = request.num_tokens - num_computed
            if cap and num_new > cap:
                num_new = cap
            if num_new > budget:
                num_new = budget
            reserved = config.num_margin_blocks if self.running else 0
            # a preload needs slots for its tokens too: they are written before the step
            num_slots = num_new + (num_computed if preload is not None else 0)
            if kv.allocate_slots(request, num_slots, hits, reserved) is None:
                return
            heapq.heappop(self._waiting)
            self._num_waiting -= 1
            self._num_waiting_tokens -= request.num_uncached_estimate
            if preload is not None:
                preloaded_ids = request.block_ids[:num_preloaded_blocks]
                out.preloads.append((request, preloaded_ids, preload.data))
                request.preloaded_kv = None
            elif request.num_preemptions == 0:
                kv.record_prefix_query(request.num_tokens, num_computed)
                request.num_cached_tokens = num_computed
            request.num_computed_tokens = num_computed
            request.status = RequestStatus.RUNNING
            if request.timing.first_scheduled_time is None:
                request.timing.first_scheduled_time = now
            self._insert_running(request)
            out.scheduled.append((request, num_new))
            budget -= num_new
            if admitted_priority is None or request.priority < admitted_priority:
                admitted_priority = request.priority

    def _free_seat_for(self, request: Request, out: SchedulerOutput) -> int | None:
        """Preempt the least important running request for `request` when it outranks it
        (lower priority value and earlier waiting key); the tokens the victim was given in
        this step go back to the budget. None: no seat for it."""
        if not self.config.preempt_for_priority or not self.running:
            return None
        victim = self.running[-1]  # kept in _running_key order: the last is the least
        if victim.priority <= request.priority or victim.sort_key <= request.sort_key:
            return None
        self.running.pop()
        refund = 0
        for k, (scheduled, n) in enumerate(out.scheduled):
            if scheduled is victim:
                refund = n
                del out.scheduled[k]
                break
        self._preempt(victim)
        out.preempted.append(victim)
        return refund

    def _insert_running(self, request: Request) -> None:
        running = self.running
        key = _running_key(request)
        lo, hi = 0, len(running)
        while lo < hi:  # bisect by key (running stays short: <= max_num_seqs)
            mid = (lo + hi) // 2
            if _running_key(running[mid]) <= key:
                lo = mid + 1
            else:
                hi = mid
        running.insert(lo, request)

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(request)
