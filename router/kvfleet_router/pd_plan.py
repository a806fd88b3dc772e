"""One request's legs through a pool, sans I/O: the P/D and peer-hint orchestration.

The router's aiohttp side (`pd.py`'s Disaggregator for the legs, `dispatch.py` for the
peer hint) and the simulator (`kvfleet_sim.fleet`) both run this module, so the simulator
cannot drift from the router. It decides; the driver routes (with its own clock, wait
queue and in-flight counts), sends, and feeds each outcome back:

    plan = PDPlan(planner, info)     # plan.role: "decode" in a P/D pool, else "unified"
    routed = <route plan.role; it may wait in the queue>
    step = plan.chosen(routed)       # RoutePrefill, or Serve
    if isinstance(step, RoutePrefill):
        step = plan.prefill_routed(<route "prefill" now, never waiting>)  # RunPrefill or Serve
    if isinstance(step, RunPrefill):
        <send step.body to step.endpoint, not streamed>
        step = plan.prefill_done(<the leg's KV handle, or None on any failure>)
    <serve the client on step.endpoint, with step.kv when there is one>

The rules (vLLM's NixlConnector conventions):

1. A pool with decode endpoints picks the decode endpoint first (`entry_role`): its
   prefix cache decides how much of the prompt is still to compute.
2. The P/D decider (`pd_deciders.py`, config `pd.decider`) looks at that choice and says
   whether a prefill leg runs; none runs without a prefill endpoint (`needs_prefill_leg`).
3. The prefill leg never queues: the request already holds a decode slot, and a busy or
   unhealthy prefill tier is better skipped (the decode endpoint computes the prompt)
   than waited for.
4. The prefill leg is the client's body with max_tokens=1, stream=false and
   kv_transfer_params={do_remote_decode: true, ...} (`prefill_body`); the engine answers
   with kv_transfer_params naming the blocks it holds, and the decode leg is the client's
   body plus those (`with_kv_transfer_params`). A failed leg leaves the decode endpoint
   to compute the prompt itself: slower, never lost. `plan.prefill_outcome` says which
   (`ok`, `failed`; None when no leg was wanted).
5. With `kv_sharing.enabled`, after the choice, a unified request's endpoint may be told
   to fetch the prompt's prefix from a peer (`peer_hint`, `RouterCore.peer_hint` decides):
   a P/D leg's KV comes from its prefill replica, and a client's own kv_transfer_params
   are never replaced. The router asks again on each retry.

The KV handle is the driver's own type: the router's is the kv_transfer_params dict the
prefill engine answered, the simulator's the held blocks as the decode replica reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from kvfleet_engine import contract

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.pd_deciders import PDDecider, build_decider
from kvfleet_router.peer_hint import HintDecision
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed, RouterCore

KV = TypeVar("KV")
PREFILL_OK = "ok"
PREFILL_FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RoutePrefill:
    """Route a prefill leg now, without waiting; feed the decision to `prefill_routed`."""


@dataclass(frozen=True, slots=True)
class RunPrefill:
    """Send `body` to the prefill endpoint (not streamed); feed the outcome to
    `prefill_done`. The driver releases the endpoint when the leg ends."""

    endpoint: EndpointState
    routed: Routed
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Serve(Generic[KV]):
    """Serve the client on the chosen endpoint; `kv`: the prefill leg's KV handle, or None
    (the endpoint computes the prompt itself)."""

    endpoint: EndpointState
    kv: KV | None = None


# What the driver does next (a variable the driver reassigns step by step).
Step: TypeAlias = RoutePrefill | RunPrefill | Serve[KV]


def entry_role(core: RouterCore) -> str:
    """The role picked first: decode in a P/D pool (its cache decides the prefill leg)."""
    return "decode" if core.has_role("decode") else "unified"


def needs_prefill_leg(role: str, decider: PDDecider, decode: Routed, has_prefill: bool) -> bool:
    """Whether a prefill endpoint should compute the prompt before decode starts."""
    return role == "decode" and decider.wants_prefill(decode) and has_prefill


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg: the client's body, one token, not streamed, KV kept for decode."""
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out[contract.KV_TRANSFER_PARAMS] = {
        contract.DO_REMOTE_DECODE: True, contract.DO_REMOTE_PREFILL: False,
        "remote_engine_id": None, contract.REMOTE_BLOCK_IDS: None,
        contract.REMOTE_HOST: None, contract.REMOTE_PORT: None,
    }
    return out


def with_kv_transfer_params(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The client's body carrying `params` (the prefill's answer, or a peer hint)."""
    return {**body, contract.KV_TRANSFER_PARAMS: params}


def asks_peer_hint(core: RouterCore, routed: Routed, role: str) -> bool:
    """Rule 5: only unified requests that carry no kv_transfer_params of their own."""
    return (core.cfg.kv_sharing.enabled and role == "unified"
            and contract.KV_TRANSFER_PARAMS not in routed.ctx.request.body)


def peer_hint(core: RouterCore, routed: Routed,
              role: str) -> tuple[HintDecision, dict[str, Any] | None] | None:
    """After the choice: None when no hint is asked for (rule 5), else the core's decision
    and the kv_transfer_params value to attach (None unless the decision is `attached`)."""
    if not asks_peer_hint(core, routed, role):
        return None
    return core.peer_hint(routed)


class Planner:
    """The plans of one routing core: it keeps the P/D decider of the config in force
    (rebuilt after a reload)."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self._decider: tuple[object, PDDecider] | None = None

    def decider(self) -> PDDecider:
        cfg = self.core.cfg
        if self._decider is None or self._decider[0] is not cfg:
            self._decider = (cfg, build_decider(cfg))
        return self._decider[1]


class PDPlan(Generic[KV]):
    """One request's legs (module docstring); the driver calls each step once, in order."""

    def __init__(self, planner: Planner, info: RequestInfo) -> None:
        self.planner = planner
        self.info = info
        self.role = entry_role(planner.core)
        self.prefill_outcome: str | None = None
        self._serving: EndpointState | None = None

    def chosen(self, routed: Routed) -> RoutePrefill | Serve[KV]:
        """The first leg's endpoint is chosen (the driver holds a request without one)."""
        e = routed.decision.endpoint
        assert e is not None, "route the first leg until it has an endpoint"
        self._serving = e
        planner = self.planner
        if needs_prefill_leg(self.role, planner.decider(), routed,
                             planner.core.has_role("prefill")):
            return RoutePrefill()
        return Serve(e)

    def prefill_routed(self, routed: Routed) -> RunPrefill | Serve[KV]:
        """No prefill endpoint eligible now: the decode endpoint computes the prompt."""
        e = routed.decision.endpoint
        if e is None:
            return self.prefill_done(None)
        return RunPrefill(e, routed, prefill_body(self.info.body))

    def prefill_done(self, kv: KV | None) -> Serve[KV]:
        """The prefill leg's KV handle, or None when it failed (or never ran)."""
        assert self._serving is not None
        self.prefill_outcome = PREFILL_FAILED if kv is None else PREFILL_OK
        return Serve(self._serving, kv)
