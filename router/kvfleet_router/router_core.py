"""The routing brain without I/O: registry + prefix indexes + policies.

It is built from a RouterConfig alone: no aiohttp app, no event loop, no sockets, no
clocks of its own (`now` is passed in). The router's dispatcher and P/D orchestrator
call it for every decision; anything else can drive it the same way (the router's
decision tests do; a replay or the simulator could):

    core = RouterCore(RouterConfig.from_dict({...}), rng=random.Random(0))
    info = RequestInfo(prompt_text="...", max_tokens=64)
    routed = core.route(info, role="unified", now=time.monotonic())
    routed.decision.endpoint        # an EndpointState, or None (reason: no-endpoint/saturated)
    e = core.start(routed)          # record the prompt's blocks there and count it in flight
    routed.matched_fraction         # estimated prefix hit fraction on the chosen endpoint
    core.first_byte(routed)         # its first byte came back: no longer pending there
    core.end(routed)                # when the request ends (in-flight drives the load scorers)

`core.record(routed)` alone remembers the prompt without touching in-flight counts, and
`core.apply(cfg)` swaps in a new config (what an admin push does). With
`kv_sharing.enabled`, `core.peer_hint(routed)` says whether the chosen endpoint should
fetch the prompt's prefix from a peer (peer_hint.py) and returns the hint to attach.
What the server adds around these calls (health feedback, learning, the wait queue)
lives in feedback.py and dispatch.py, so a driver that wants the adaptive policies to learn calls
`HealthFeedback.exchange_done` after each exchange, as the dispatcher does.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine.contract.peer_prefix import peer_prefix_hint

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.flow.seats import Seat
from kvfleet_router.peer_hint import (
    NO_PEER,
    NOT_ELIGIBLE,
    HintDecision,
    PeerCandidate,
    can_serve_cache,
    can_take_hint,
    decide_peer_hint,
    decision_inputs,
    fetch_credit,
    fetch_timeout_s,
)
from kvfleet_router.policies.context import RouteContext
from kvfleet_router.policies.policy import Decision, Policy, build_policies
from kvfleet_router.prefix_index import ApproxPrefixIndex, PreciseKVIndex, hash_tokens
from kvfleet_router.registry import Registry
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.text_tokens import TextTokens


@dataclass(slots=True)
class Routed:
    decision: Decision
    ctx: RouteContext
    hashes: list[int] = field(default_factory=list)
    policy_name: str = ""
    # block size -> (router chain of the prompt's token blocks, endpoint -> leading blocks)
    precise: dict[int, tuple[list[int], dict[str, int]]] = field(default_factory=dict)
    num_hinted_blocks: int = 0  # blocks named in an attached peer hint
    seat: Seat | None = None  # the dispatcher's record of the seat taken (flow/seats.py)
    is_pending: bool = False  # started and no first byte yet (EndpointState.num_pending)

    @property
    def matched_fraction(self) -> float:
        e = self.decision.endpoint
        return self.ctx.prefix_fraction.get(e.name, 0.0) if e is not None else 0.0


def prompt_bytes(info: RequestInfo) -> bytes:
    if info.prompt_token_ids is not None:
        return array("q", info.prompt_token_ids).tobytes()
    return info.prompt_text.encode("utf-8", "surrogatepass")


class RouterCore:
    def __init__(self, cfg: RouterConfig, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.registry = Registry()
        self.precise = PreciseKVIndex()
        self.approx = ApproxPrefixIndex(cfg.prefix.block_bytes, cfg.prefix.max_blocks_per_endpoint)
        self.num_prompt_blocks = 0  # for the estimated prefix hit ratio
        self.num_matched_blocks = 0.0
        # told of every chain recorded on a decision (exchange.py shares them with peers)
        self.recorder: Callable[[str, list[int]], None] | None = None
        self.text_tokens = TextTokens()  # text prompts -> token ids (prefix.tokenizer)
        self.apply(cfg)

    def apply(self, cfg: RouterConfig) -> list[EndpointState]:
        """Install a new config; the caller has validated it. Returns removed endpoints."""
        if (cfg.prefix.block_bytes != self.approx.block_bytes):
            self.approx = ApproxPrefixIndex(cfg.prefix.block_bytes,
                                            cfg.prefix.max_blocks_per_endpoint)
        self.approx.max_blocks_per_endpoint = cfg.prefix.max_blocks_per_endpoint
        policies: dict[str, Policy] = build_policies(cfg)
        gone = self.registry.apply(cfg)
        self.text_tokens.configure(cfg.prefix.tokenizer)
        for e in gone:
            self.approx.forget_endpoint(e.name)
            self.precise.reset(e.name)
        self.cfg, self.policies = cfg, policies
        return gone

    def has_role(self, role: str) -> bool:
        return any(e.role == role for e in self.registry.endpoints)

    def prefix_fractions(self, info: RequestInfo, hashes: list[int],
                         endpoints: list[EndpointState],
                         by_size: dict[int, tuple[list[int], dict[str, int]]] | None = None,
                         ) -> dict[str, float]:
        """endpoint -> matched fraction of the prompt's blocks; `by_size` (filled in) keeps
        the precise index's chains and matches per block size."""
        out: dict[str, float] = {}
        if hashes:
            for name, n in self.approx.match(hashes).items():
                out[name] = n / len(hashes)
        # the client's ids, or the text's when a tokenizer is configured (text_tokens.py)
        tokens = self.text_tokens.ids(info, endpoints, self.precise.block_sizes)
        if tokens is None:
            return out
        if by_size is None:
            by_size = {}
        for e in endpoints:
            size = self.precise.block_sizes.get(e.name)
            if e.prefix_mode != "precise" or not size:
                continue
            if size not in by_size:
                th = hash_tokens(tokens, size)
                by_size[size] = (th, self.precise.match(th) if th else {})
            th, matched = by_size[size]
            if th:
                out[e.name] = matched.get(e.name, 0) / len(th)
        return out

    def route(self, info: RequestInfo, role: str, now: float, policy_name: str | None = None,
              exclude: frozenset[str] = frozenset(),
              allowed: frozenset[str] | None = None,
              outranked: dict[str, int] | None = None) -> Routed:
        """`exclude`: endpoints already tried; `allowed`: only these may serve (a gateway's
        subset hint), None for any; `outranked`: endpoint -> seats the request outranks
        (RouteContext.outranked)."""
        name = policy_name or self.cfg.policy.name
        policy = self.policies[name]
        endpoints = self.registry.endpoints
        if exclude or allowed is not None:
            endpoints = [e for e in endpoints if e.name not in exclude and
                         (allowed is None or e.name in allowed)]
        hashes = self.approx.hash_bytes(prompt_bytes(info))
        self.text_tokens.ids(info, endpoints, self.precise.block_sizes)  # exact prompt size
        ctx = RouteContext(request=info, role=role, now=now, rng=self.rng,
                           num_prompt_tokens=info.estimated_prompt_tokens(
                               self.cfg.prefix.chars_per_token),
                           slo_ttft_s=info.slo_ttft_s, slo_tpot_s=info.slo_tpot_s,
                           outranked=outranked or {}, prefix_index=self.approx)
        by_size: dict[int, tuple[list[int], dict[str, int]]] = {}
        ctx.prefix_fraction = self.prefix_fractions(info, hashes, endpoints, by_size)
        if self.cfg.kv_sharing.enabled and by_size and policy.scores_prefix:
            ctx.peer_credit = self.peer_credits(endpoints, by_size, ctx)
        return Routed(policy.choose(endpoints, ctx), ctx, hashes, name, by_size)

    def block_size(self, e: EndpointState) -> int:
        """The endpoint's KV block size: from its KV events, else its last scrape (a replica
        that has stored nothing yet, such as a new one, still takes hints); 0 if unknown."""
        return self.precise.block_sizes.get(e.name) or e.signals.block_size

    def peer_holders(self, matched: dict[str, int], size: int, model: str | None,
                     now: float) -> list[PeerCandidate]:
        """Endpoints that hold leading blocks of the prompt (`matched`) at block size `size`
        and may serve them to a peer (`can_serve_cache`), longest first (registry order on
        ties): the best peer of any endpoint is the first one that is not itself."""
        holders = [PeerCandidate(p.name, p.url, matched[p.name], p.peer_measure.bytes_per_block)
                   for p in self.registry.endpoints
                   if p.name in matched and self.block_size(p) == size
                   and can_serve_cache(p, model, now)]
        holders.sort(key=lambda c: c.num_blocks, reverse=True)
        return holders

    def peer_credits(self, endpoints: list[EndpointState],
                     by_size: dict[int, tuple[list[int], dict[str, int]]],
                     ctx: RouteContext) -> dict[str, float]:
        """endpoint -> the prompt's fraction a fetch from the best peer is worth there
        (`peer_hint.fetch_credit`, the rule `peer_hint` applies after the choice)."""
        tokens = ctx.request.token_ids
        out: dict[str, float] = {}
        if tokens is None:
            return out
        for size, (chain, matched) in by_size.items():
            holders = self.peer_holders(matched, size, ctx.request.model, ctx.now)[:2]
            if not chain or not holders:
                continue
            for e in endpoints:
                if not can_take_hint(e) or self.block_size(e) != size:
                    continue
                best = next((c for c in holders if c.name != e.name), None)
                if best is None:
                    continue
                local = matched.get(e.name, 0)
                credit = fetch_credit(decide_peer_hint(decision_inputs(
                    e, local, len(tokens), size, [best], self.cfg)), local)
                if credit > 0:
                    out[e.name] = credit / len(chain)
        return out

    def peer_hint(self, routed: Routed) -> tuple[HintDecision, dict[str, Any] | None]:
        """Whether the chosen endpoint should take the prompt's prefix from a peer, and the
        `kv_transfer_params` value naming it (None unless the decision is `attached`)."""
        e = routed.decision.endpoint
        tokens = routed.ctx.request.token_ids
        size = self.block_size(e) if e is not None else 0
        if e is None or tokens is None or not size or not can_take_hint(e):
            return HintDecision(NOT_ELIGIBLE), None
        chain, matched = routed.precise.get(size) or ([], {})
        if not chain:  # the policy's candidates had other block sizes: match here
            chain = hash_tokens(tokens, size)
            matched = self.precise.match(chain) if chain else {}
        ctx = routed.ctx
        peers = [c for c in self.peer_holders(matched, size, ctx.request.model, ctx.now)
                 if c.name != e.name]
        decision = decide_peer_hint(decision_inputs(
            e, matched.get(e.name, 0), len(tokens), size, peers, self.cfg))
        if not decision.is_attached or decision.peer is None:
            return decision, None
        engine_hashes = self.precise.engine_hashes(decision.peer.name,
                                                   chain[:decision.num_blocks])
        if not engine_hashes:
            return HintDecision(NO_PEER), None
        routed.num_hinted_blocks = decision.num_blocks
        return decision, peer_prefix_hint(decision.peer.url, engine_hashes,
                                          fetch_timeout_s(decision))

    def record(self, routed: Routed) -> None:
        """Remember the prompt on the chosen endpoint (also when balancing by load)."""
        e = routed.decision.endpoint
        if e is None:
            return
        self.approx.record(e.name, routed.hashes)
        if self.recorder is not None:
            self.recorder(e.name, routed.hashes)
        self.num_prompt_blocks += len(routed.hashes)
        self.num_matched_blocks += routed.matched_fraction * len(routed.hashes)

    def start(self, routed: Routed) -> EndpointState | None:
        """Record the prompt on the chosen endpoint and count the request in flight there,
        and pending (with its uncached prompt tokens) until `first_byte`."""
        e = routed.decision.endpoint
        if e is not None:
            self.record(routed)
            e.num_in_flight += 1
            e.num_pending += 1
            e.pending_tokens += routed.ctx.uncached_tokens(e.name)
            routed.is_pending = True
        return e

    @staticmethod
    def first_byte(routed: Routed) -> None:
        """The exchange `routed` started has answered its first byte, or ended without one:
        it no longer waits for a prefill there. Once per exchange; later calls are no-ops,
        so every path may call it again when the exchange ends."""
        e = routed.decision.endpoint
        if routed.is_pending and e is not None:
            routed.is_pending = False
            e.num_pending -= 1
            # the same figure start added (ctx is fixed once routed); float sums need not
            # come back to exactly zero: none pending, no tokens pending
            e.pending_tokens = (e.pending_tokens - routed.ctx.uncached_tokens(e.name)
                                if e.num_pending else 0.0)

    @staticmethod
    def finish(e: EndpointState) -> None:
        e.num_in_flight -= 1

    @staticmethod
    def end(routed: Routed) -> None:
        """The exchange `routed` started ended, with or without a first byte: neither
        pending nor in flight on its endpoint any more."""
        RouterCore.first_byte(routed)
        if routed.decision.endpoint is not None:
            RouterCore.finish(routed.decision.endpoint)

    @property
    def prefix_hit_ratio(self) -> float:
        return self.num_matched_blocks / self.num_prompt_blocks if self.num_prompt_blocks else 0.0
