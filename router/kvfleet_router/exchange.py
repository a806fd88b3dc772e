"""Router replicas of one pool that route as one: an eventually consistent state exchange.

Each router process keeps its own approximate prefix index, in-flight counts and session
placements. Behind a Service, replica A does not know that replica B just sent a
conversation to engine X, and would send its next turn to engine Y. Here every process
pushes what it learned since its last push to every peer, each `exchange.interval_s`:

- the prompt chains it recorded, per endpoint (each chain identified by its last block hash,
  which covers the whole prefix: recording one conversation ten times sends it once);
- its own in-flight count per endpoint (absolute, so a lost push costs nothing);
- the session -> revision placements a rollout's split made (revisions.py).

A receiver records the chains in its own approximate index, keeps each peer's in-flight
counts for `stale_after_s` after that peer's last push (summed into
`EndpointState.peer_in_flight`, which the load scorers, the guard and the saturation
filters read through `in_flight_total`), and adopts session placements it has not made
itself. A process that starts pulls a whole snapshot from the first peer that answers
(`exchange.warm`) and routes with it from then on; requests never wait for it.

Transport: `POST /admin/exchange` and `GET /admin/exchange/snapshot` on the router's own
port, behind the admin bearer token (the pool's token: an unauthenticated peer gets 401).
Block hashes are Python `hash` values, comparable only between processes with the same
PYTHONHASHSEED (exchange_seed.py); a batch whose fingerprint differs is refused with 409.

Peers are the config's `peers`, every address `peers_dns` resolves to (a headless Service
on Kubernetes, re-resolved every `refresh_s`) and the pod's sibling workers (workers.py,
always, whatever `enabled` says). A URL that turns out to be this process (its id comes
back) is dropped; one of this pod's siblings reached through the pod address is pushed to
no more (same group). A batch from another pod arrives at one worker of this pod, which
relays it once to its siblings.

Under a partition each side routes on what it has: a push that fails or times out is
dropped and counted, never retried or queued beyond `max_batch_blocks`, and a silent
peer's in-flight counts stop counting after `stale_after_s`. Nothing on the request path
waits for the network.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import os
import secrets
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from kvfleet_engine.contract.http_limits import JSONRejected, strict_loads
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvfleet_router.config import ExchangeConfig, RouterConfig
from kvfleet_router.errors import error_response
from kvfleet_router.exchange_seed import GROUP_ENV, fingerprint

log = logging.getLogger(__name__)

PUSH_PATH = "/admin/exchange"
SNAPSHOT_PATH = "/admin/exchange/snapshot"
MAX_SESSIONS_PER_PUSH = 10_000


# --- wire format: chains as base64 of signed 64-bit arrays (hash values fit) ---

def encode_chain(hashes: Iterable[int]) -> str:
    return base64.b64encode(array("q", hashes).tobytes()).decode("ascii")


def decode_chain(text: str) -> list[int]:
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 8:
        raise ValueError("a chain is a whole number of 8-byte hashes")
    return array("q", raw).tolist()


class Outbox:
    """What this process learned since its last push. Bounded: past `max_blocks` the
    oldest chains go first (counted in `num_dropped_blocks`)."""

    def __init__(self) -> None:
        self.chains: OrderedDict[tuple[str, int], list[int]] = OrderedDict()
        self.num_blocks = 0
        self.num_dropped_blocks = 0
        self.sessions: dict[str, str] = {}

    def add(self, endpoint: str, hashes: list[int], max_blocks: int) -> None:
        if not hashes:
            return
        key = (endpoint, hashes[-1])  # the last block's hash names the whole chain
        chains = self.chains
        if key in chains:
            chains.move_to_end(key)
            return
        chains[key] = hashes
        self.num_blocks += len(hashes)
        while self.num_blocks > max_blocks and chains:
            _, old = chains.popitem(last=False)
            self.num_blocks -= len(old)
            self.num_dropped_blocks += len(old)

    def add_session(self, key: str, revision: str) -> None:
        if len(self.sessions) < MAX_SESSIONS_PER_PUSH or key in self.sessions:
            self.sessions[key] = revision

    def take(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        """The chains per endpoint (encoded) and sessions to push; empties the outbox."""
        records: dict[str, list[str]] = {}
        for (endpoint, _), hashes in self.chains.items():
            records.setdefault(endpoint, []).append(encode_chain(hashes))
        sessions = self.sessions
        self.chains, self.num_blocks, self.sessions = OrderedDict(), 0, {}
        return records, sessions


@dataclass(slots=True)
class PeerCounts:
    received_at: float
    in_flight: dict[str, float] = field(default_factory=dict)
    group: str = ""  # the sender's pod (its workers share one): siblings vs other pods


def peer_in_flight(peers: dict[str, PeerCounts], now: float,
                   stale_after_s: float) -> dict[str, float]:
    """endpoint -> in flight summed over peers heard from within `stale_after_s`."""
    out: dict[str, float] = {}
    for counts in peers.values():
        if now - counts.received_at > stale_after_s:
            continue
        for name, n in counts.in_flight.items():
            out[name] = out.get(name, 0.0) + n
    return out


def url_of(host: str, port: int) -> str:
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            return f"http://[{host}]:{port}"
    return f"http://{host}:{port}"


class Exchange:
    """One router process's side of the exchange (module docstring). `core` is the
    RouterCore whose index and endpoints it shares; `split` the dispatcher's RevisionSplit
    (sessions), or None."""

    def __init__(self, core: Any, token: str | None, siblings: list[str] | None = None,
                 split: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.core, self.token, self.split, self.clock = core, token, split, clock
        self.id = secrets.token_hex(8)
        self.group = os.environ.get(GROUP_ENV) or self.id
        self.siblings = list(siblings or [])
        self.outbox = Outbox()
        self.peers: dict[str, PeerCounts] = {}  # peer id -> its last in-flight report
        self.self_urls: set[str] = set()  # URLs that answered with our id or our group
        self.dns_peers: list[str] = []
        self._dns_at = -1e18
        self.last_sent_in_flight: dict[str, float] = {}
        self.last_push_at = -1e18
        self.is_warm = False
        self.session: aiohttp.ClientSession | None = None
        self.num_pushes = {"ok": 0, "error": 0, "refused": 0}
        self.num_received = {"batches": 0, "blocks": 0, "sessions": 0}
        self.num_refused_batches = 0
        self.num_warm_blocks = 0
        self._relays: set[asyncio.Task[None]] = set()
        core.recorder = self.on_record
        if split is not None:
            split.on_assign = self.outbox.add_session

    @property
    def cfg(self) -> ExchangeConfig:
        cfg: RouterConfig = self.core.cfg
        return cfg.exchange

    @property
    def is_active(self) -> bool:
        return bool(self.siblings) or (self.cfg.enabled and self.token is not None)

    def on_record(self, endpoint: str, hashes: list[int]) -> None:
        """RouterCore.record's hook: called on the request path, so only an append."""
        if self.is_active:
            self.outbox.add(endpoint, hashes, self.cfg.max_batch_blocks)

    # --- peers ---
    def remote_peers(self) -> list[str]:
        cfg = self.cfg
        if not cfg.enabled or self.token is None:
            return []
        seen = set(self.siblings) | self.self_urls
        out: list[str] = []
        for url in (*cfg.peers, *self.dns_peers):
            url = url.rstrip("/")
            if url not in seen:
                seen.add(url)
                out.append(url)
        return out

    async def resolve_dns(self) -> None:
        cfg = self.cfg
        if not cfg.enabled or not cfg.peers_dns:
            self.dns_peers = []
            return
        now = self.clock()
        if now - self._dns_at < cfg.refresh_s:
            return
        self._dns_at = now
        host, _, port = cfg.peers_dns.rpartition(":")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, int(port), type=0, proto=6)
        except (OSError, UnicodeError) as exc:
            log.warning("exchange: cannot resolve %s: %s (keeping %d known peers)",
                        cfg.peers_dns, exc, len(self.dns_peers))
            return
        self.dns_peers = sorted({url_of(str(info[4][0]), int(port)) for info in infos})

    # --- pushing ---
    def own_in_flight(self) -> dict[str, float]:
        return {e.name: float(e.num_in_flight) for e in self.core.registry.endpoints}

    def batch(self, relay: bool, records: dict[str, list[str]], sessions: dict[str, str],
              in_flight: dict[str, float]) -> dict[str, Any]:
        return {"id": self.id, "group": self.group, "fingerprint": fingerprint(),
                "block_bytes": self.core.approx.block_bytes, "relay": relay,
                "records": records, "in_flight": in_flight, "sessions": sessions}

    def is_push_due(self, in_flight: dict[str, float], now: float) -> bool:
        """Anything new to say, or a heartbeat so peers' view of our load stays fresh."""
        return bool(self.outbox.chains or self.outbox.sessions
                    or in_flight != self.last_sent_in_flight
                    or now - self.last_push_at >= self.cfg.stale_after_s / 3)

    async def push_once(self) -> None:
        now = self.clock()
        self.refresh_peer_load(now)
        remote, siblings = self.remote_peers(), self.siblings
        if not remote and not siblings:
            self.outbox.take()  # nobody to tell (yet): keep nothing
            return
        in_flight = self.own_in_flight()
        if not self.is_push_due(in_flight, now):
            return
        records, sessions = self.outbox.take()
        self.last_sent_in_flight, self.last_push_at = in_flight, now
        sends = [self.post(url, self.batch(False, records, sessions, in_flight))
                 for url in siblings]
        sends += [self.post(url, self.batch(True, records, sessions, in_flight))
                  for url in remote]
        await asyncio.gather(*sends)

    async def post(self, url: str, body: dict[str, Any]) -> None:
        assert self.session is not None
        try:
            async with self.session.post(
                    url + PUSH_PATH, json=body,
                    headers={"Authorization": f"Bearer {self.token or ''}"},
                    timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s)) as resp:
                answer = await resp.json(content_type=None) if resp.status == 200 else {}
                if resp.status != 200:
                    self.num_pushes["refused" if resp.status in (401, 409) else "error"] += 1
                    log.debug("exchange: %s answered %d", url, resp.status)
                    return
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            self.num_pushes["error"] += 1
            log.debug("exchange: push to %s failed: %s", url, exc)
            return
        self.num_pushes["ok"] += 1
        if isinstance(answer, dict) and url not in self.siblings and (
                answer.get("id") == self.id or answer.get("group") == self.group):
            self.self_urls.add(url)  # ourselves (or our own pod) through a shared address

    # --- receiving ---
    def check_batch(self, body: Any) -> str | None:
        """Why a batch cannot be applied, or None."""
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            return "an exchange batch is an object with a string id"
        if body.get("fingerprint") != fingerprint():
            return ("the peer hashes prompt bytes with another seed (PYTHONHASHSEED): its "
                    "block hashes mean nothing here; run every router of the pool with the "
                    "same admin token")
        if body.get("block_bytes") != self.core.approx.block_bytes:
            return (f"block_bytes {body.get('block_bytes')} differs from this router's "
                    f"{self.core.approx.block_bytes}")
        for name in ("records", "in_flight", "sessions"):
            if not isinstance(body.get(name, {}), dict):
                return f"{name} must be an object"
        return None

    def apply_batch(self, body: dict[str, Any]) -> None:
        if body["id"] == self.id:
            return
        known = self.core.registry.by_name
        approx = self.core.approx
        num_blocks = 0
        for endpoint, chains in body.get("records", {}).items():
            if endpoint not in known or not isinstance(chains, list):
                continue  # not (or no longer) in this replica's config
            for text in chains:
                hashes = decode_chain(text)
                approx.record(endpoint, hashes)
                num_blocks += len(hashes)
        counts = {str(k): float(v) for k, v in body.get("in_flight", {}).items()
                  if isinstance(v, (int, float)) and v >= 0}
        self.peers[body["id"]] = PeerCounts(self.clock(), counts, str(body.get("group", "")))
        self.refresh_peer_load(self.clock())
        sessions = body.get("sessions", {})
        if self.split is not None:
            for key, revision in sessions.items():
                self.split.adopt(str(key), str(revision))
        self.num_received["batches"] += 1
        self.num_received["blocks"] += num_blocks
        self.num_received["sessions"] += len(sessions)

    def refresh_peer_load(self, now: float) -> None:
        stale = self.cfg.stale_after_s
        for pid in [p for p, c in self.peers.items() if now - c.received_at > 10 * stale]:
            del self.peers[pid]  # long gone: forget it
        totals = peer_in_flight(self.peers, now, stale)
        for e in self.core.registry.endpoints:
            e.peer_in_flight = totals.get(e.name, 0.0)

    async def handle_push(self, request: web.Request) -> web.Response:
        try:
            body = strict_loads(await request.read())
        except JSONRejected as exc:
            return error_response(f"exchange batch refused: {exc}", 400, code=exc.code)
        why = self.check_batch(body)
        if why is not None:
            self.num_refused_batches += 1
            return error_response(why, 409, code="exchange_mismatch")
        try:
            self.apply_batch(body)
        except (ValueError, TypeError) as exc:
            self.num_refused_batches += 1
            return error_response(f"exchange batch refused: {exc}", 400,
                                  code="invalid_exchange_batch")
        if body.get("relay") and body.get("group") != self.group and self.siblings:
            relayed = dict(body, relay=False)
            task = asyncio.get_running_loop().create_task(self.relay(relayed))
            self._relays.add(task)
            task.add_done_callback(self._relays.discard)
        return web.json_response({"id": self.id, "group": self.group})

    async def relay(self, body: dict[str, Any]) -> None:
        await asyncio.gather(*(self.post(url, body) for url in self.siblings))

    def snapshot(self) -> dict[str, Any]:
        """The whole approximate index (each endpoint's blocks newest first, the order
        `ChainIndex.record` restores) and the sessions' revisions."""
        approx = self.core.approx
        index = {name: encode_chain(approx.blocks_newest_first(name))
                 for name in approx.endpoints()}
        sessions = dict(self.split.sessions) if self.split is not None else {}
        return {"id": self.id, "group": self.group, "fingerprint": fingerprint(),
                "block_bytes": approx.block_bytes, "index": index, "sessions": sessions}

    async def handle_snapshot(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    def apply_snapshot(self, body: dict[str, Any]) -> int:
        """Record a peer's snapshot here; returns the blocks taken."""
        why = self.check_batch(body) if isinstance(body, dict) else "not an object"
        if why is not None:
            raise ValueError(why)
        known = self.core.registry.by_name
        num_blocks = 0
        for endpoint, text in body.get("index", {}).items():
            if endpoint in known:
                hashes = decode_chain(text)
                self.core.approx.record(endpoint, hashes)
                num_blocks += len(hashes)
        if self.split is not None:
            for key, revision in body.get("sessions", {}).items():
                self.split.adopt(str(key), str(revision))
        return num_blocks

    async def warm(self) -> None:
        """Copy a peer's index once this router knows its endpoints; try each peer in turn
        for up to a minute. Routing goes on meanwhile."""
        deadline = self.clock() + 60.0
        while not self.is_warm and self.clock() < deadline:
            if self.core.registry.endpoints and self.cfg.warm:
                await self.resolve_dns()
                for url in [*self.siblings, *self.remote_peers()]:
                    if await self.warm_from(url):
                        return
            await asyncio.sleep(1.0)

    async def warm_from(self, url: str) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(
                    url + SNAPSHOT_PATH, headers={"Authorization": f"Bearer {self.token or ''}"},
                    timeout=aiohttp.ClientTimeout(total=max(5.0, self.cfg.timeout_s))) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
            if body.get("id") == self.id:
                self.self_urls.add(url)
                return False
            self.num_warm_blocks = self.apply_snapshot(body)
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as exc:
            log.debug("exchange: no snapshot from %s: %s", url, exc)
            return False
        self.is_warm = True
        log.info("exchange: warmed from %s (%d blocks)", url, self.num_warm_blocks)
        return True

    # --- lifecycle ---
    async def run(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        warming = asyncio.get_running_loop().create_task(self.warm())
        try:
            while True:
                await asyncio.sleep(self.cfg.interval_s)
                if not self.is_active:
                    self.refresh_peer_load(self.clock())
                    continue
                await self.resolve_dns()
                await self.push_once()
        finally:
            warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warming
            await self.session.close()

    def add_routes(self, webapp: web.Application) -> None:
        webapp.router.add_post(PUSH_PATH, self.handle_push)
        webapp.router.add_get(SNAPSHOT_PATH, self.handle_snapshot)


class ExchangeCollector(Collector):
    """kvfleet_router_exchange_* on /metrics."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def collect(self) -> Iterable[Any]:
        x = self.exchange
        pushes = CounterMetricFamily("kvfleet_router_exchange_pushes",
                                     "Exchange batches sent to peers, by outcome "
                                     "(refused: 401/409)", labels=["outcome"])
        for outcome, n in x.num_pushes.items():
            pushes.add_metric([outcome], n)
        received = CounterMetricFamily("kvfleet_router_exchange_received",
                                       "What peers' batches brought", labels=["kind"])
        for kind, n in x.num_received.items():
            received.add_metric([kind], n)
        yield pushes
        yield received
        yield CounterMetricFamily("kvfleet_router_exchange_refused_batches",
                                  "Peers' batches refused (hash seed or block size differs, "
                                  "malformed)", value=x.num_refused_batches)
        yield CounterMetricFamily("kvfleet_router_exchange_dropped_blocks",
                                  "Recorded blocks dropped unsent (max_batch_blocks)",
                                  value=x.outbox.num_dropped_blocks)
        now = x.clock()
        fresh = sum(1 for c in x.peers.values()
                    if now - c.received_at <= x.cfg.stale_after_s)
        yield GaugeMetricFamily("kvfleet_router_exchange_peers",
                                "Peers heard from within stale_after_s", value=fresh)
        yield GaugeMetricFamily("kvfleet_router_exchange_warm_blocks",
                                "Blocks copied from a peer's snapshot at start",
                                value=x.num_warm_blocks)
