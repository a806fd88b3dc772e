"""sgl-router's `cache_aware` rule, modelled for the simulator (a peer, not a kvfleet policy).

What sglang-router 0.3.2 (the version bench/setup_peers.sh installs) does per request, with
the defaults its launcher passes (`sglang_router/router_args.py`):
1. Load = the requests the router itself has in flight on each worker. When
   max - min > balance_abs_threshold (64) and max > balance_rel_threshold (1.5) x min,
   it sends the request to the least-loaded worker.
2. Otherwise it walks one radix tree of prompt text shared by all workers as far as the
   prompt matches, and takes a worker that holds the deepest node reached. If the
   matched share of the prompt is above cache_threshold (0.3), that worker serves;
   else the worker whose tree holds the fewest characters ("most cache space").
3. Either way the prompt is inserted into the tree for the chosen worker. The tree
   evicts least recently used leaves only once a worker's share passes max_tree_size
   (2^26 characters), checked every 60 s.

The model: the tree is a `ChainIndex` over the router's own 64-byte block hashes (the
request's bytes, as kvfleet's approximate index hashes them), so matches are counted in
whole blocks rather than characters, and its bound is max_tree_size in blocks. A worker's
tree size is its block count. Ties (equal matches, equal sizes, equal loads) are broken
at random: sglang-router takes them from hash-map iteration order, random per process.

An earlier model here was kvfleet's cache-aware preset with only the prefix scorer behind
kvfleet's guard at thresholds 32 / 1.0001: it had no cache threshold and no smallest-tree
fallback (a request matching nothing went to a random worker, not the emptiest), its
guard counted the engines' scraped load besides the router's own, and its thresholds
were an older sglang-router's.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.policies.context import RouteContext, load_snapshot
from kvfleet_router.policies.guard import is_imbalanced
from kvfleet_router.policies.policy import Decision, Policy, pipeline_of
from kvfleet_router.prefix_index import ApproxPrefixIndex, ChainIndex
from kvfleet_router.router_core import RouterCore, prompt_bytes


@dataclass(slots=True, frozen=True)
class SglDefaults:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 2**26


class SglCacheAware(Policy):
    """Takes the place of a policy in a simulated router core (`SglRule`)."""

    def __init__(self, name: str, cfg: RouterConfig, hasher: ApproxPrefixIndex,
                 tree: ChainIndex, sgl: SglDefaults) -> None:  # fmt: skip
        super().__init__(name, cfg, pipeline_of("cache-aware", cfg))  # for eligibility
        self.scores_prefix = False
        self.hasher = hasher
        self.tree = tree
        self.sgl = sgl

    def choose(self, endpoints: list[EndpointState], ctx: RouteContext) -> Decision:
        candidates = self.eligible(endpoints, ctx)
        if not candidates:
            return Decision(None, "no-endpoint")
        sgl, rng = self.sgl, ctx.rng
        hashes = self.hasher.hash_bytes(prompt_bytes(ctx.request))
        loads = [e.num_in_flight for e in candidates]
        if is_imbalanced(loads, sgl.balance_abs_threshold, sgl.balance_rel_threshold):
            low = min(loads)
            chosen = rng.choice([e for e, n in zip(candidates, loads, strict=True) if n == low])
            reason = "balanced"
        else:
            matched = self.tree.match(hashes)
            names = {e.name for e in candidates}
            best = max((n for ep, n in matched.items() if ep in names), default=0)
            if hashes and best / len(hashes) > sgl.cache_threshold:
                chosen = rng.choice([e for e in candidates if matched.get(e.name) == best])
            else:
                sizes = [self.tree.num_blocks(e.name) for e in candidates]
                chosen = rng.choice([e for e, s in zip(candidates, sizes, strict=True)
                                     if s == min(sizes)])
            reason = "picked"
        self.tree.record(chosen.name, hashes)
        ctx.chosen_load = load_snapshot(chosen, ctx.uncached_tokens(chosen.name))
        return Decision(chosen, reason, 0.0)


class SglRule:
    """A `SimRouter.after_push` hook: after every config push (which rebuilds the core's
    policies) the policy the config names becomes the sgl rule. The tree outlives pushes,
    as sglang-router's does while its workers stay."""

    def __init__(self, sgl: SglDefaults = SglDefaults()) -> None:
        self.sgl = sgl
        self.tree: ChainIndex | None = None

    def __call__(self, core: RouterCore) -> None:
        if self.tree is None:
            self.tree = ChainIndex(max(1, self.sgl.max_tree_chars // core.approx.block_bytes))
        name = core.cfg.policy.name
        core.policies[name] = SglCacheAware(name, core.cfg, core.approx, self.tree, self.sgl)
