"""A pod of N workers (`kvfleet router --workers N`) answers GET /admin/config and GET
/metrics on its public port as one router.

The kernel hands each connection to one worker, so without this the operator would read
one worker's in-flight counts (and could delete a replica another worker still streams
from) and Prometheus one worker's counters. The worker a request lands on asks each
sibling for its own view over the private loopback ports and merges:

- `GET /admin/config`: per endpoint `num_in_flight` summed; `peer_in_flight` = in-flight
  that router processes *outside the pod* reported (siblings dropped: each worker's own
  value counts its siblings' requests, which `num_in_flight` already sums), the largest
  any worker heard (every worker hears every remote peer, directly or relayed);
  `is_healthy` only if healthy in every worker; `state` the least advanced (active <
  draining < removed: a worker that missed a push still sends there); `revisions`
  summed (`revision_stats.combine`); `version` and `config` those of the oldest worker
  (so the operator re-pushes to one that missed a push); `"workers": N`. A sibling that
  does not answer within `VIEW_TIMEOUT_S` (or answers badly) makes the answer a 503: a
  partial sum could let a drain finish while a silent worker still streams, and the
  operator treats a 503 as "view unknown" (router_control.view returns None).
- `GET /metrics`: every worker's samples, each with a `worker="<index>"` label, grouped
  per family (Prometheus' usual answer for several processes; queries aggregate with
  `sum by`/`max by`, and a counter that restarts with its worker is one series resetting,
  which `rate()` handles, where a pod-wide sum would drop and read as a huge increase).
  A sibling that does not answer is left out and `kvfleet_router_worker_up{worker}` says
  0 for it: a scrape keeps the workers it has.

A worker answers for itself on its private port, or anywhere with `?worker=self` (what
siblings are asked with, so a view never recurses). Its own /admin/config then also
carries `worker: {index, exchange_id, peers_in_flight: {peer id: {endpoint: n}}}` (fresh
peers of other pods only, by the exchange's pod group); the merge also drops any peer id
that is one of the pod's workers, so a view from a worker that predates groups still sums
right.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvfleet_router.revision_stats import RevisionCounts, combine

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

    from kvfleet_router.app import RouterApp

SELF_QUERY = "worker"  # ?worker=self: this worker's own answer
VIEW_TIMEOUT_S = 2.0  # a sibling on the loopback answers in ms unless it is stuck
WORKER_LABEL = "worker"
UP_METRIC = "kvfleet_router_worker_up"
_STATE_ORDER = {"active": 0, "draining": 1, "removed": 2}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class WorkerUnavailable(Exception):
    """A sibling gave no usable view: the pod's view is unknown."""


def sibling_indexes(index: int, num_siblings: int) -> list[int]:
    """The worker index of each sibling URL: the supervisor lists them in index order
    with this worker left out (workers.child_argv)."""
    return [j if j < index else j + 1 for j in range(num_siblings)]


# --- /admin/config ---

def _remote_in_flight(view: dict[str, Any], pod_ids: set[str]) -> dict[str, float]:
    """endpoint -> in-flight that this worker heard from processes outside the pod."""
    out: dict[str, float] = {}
    for peer, counts in view["worker"]["peers_in_flight"].items():
        if peer in pod_ids:
            continue
        for name, n in counts.items():
            out[name] = out.get(name, 0.0) + float(n)
    return out


def merge_config_views(views: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod's GET /admin/config from every worker's own (module docstring). Raises
    ValueError (or KeyError, TypeError) when a view is malformed."""
    if not views:
        raise ValueError("no worker views to merge")
    oldest = min(views, key=lambda v: int(v["version"]))
    pod_ids = {str(v["worker"]["exchange_id"]) for v in views}
    endpoints: dict[str, dict[str, Any]] = {}
    remote: dict[str, float] = {}
    for view in views:
        for name, n in _remote_in_flight(view, pod_ids).items():
            remote[name] = max(remote.get(name, 0.0), n)
        for e in view["endpoints"]:
            seen = endpoints.get(e["name"])
            if seen is None:
                endpoints[e["name"]] = {**e, "num_in_flight": int(e["num_in_flight"]),
                                        "is_healthy": bool(e["is_healthy"])}
                continue
            seen["num_in_flight"] += int(e["num_in_flight"])
            seen["is_healthy"] = seen["is_healthy"] and bool(e["is_healthy"])
            if _STATE_ORDER.get(e["state"], 0) < _STATE_ORDER.get(seen["state"], 0):
                seen["state"] = e["state"]
    for name, e in endpoints.items():
        e["peer_in_flight"] = remote.get(name, 0.0)
    revisions = combine([{rev: RevisionCounts.from_dict(c) for rev, c in
                          (v.get("revisions") or {}).items()} for v in views])
    return {"version": int(oldest["version"]), "config": oldest["config"],
            "endpoints": list(endpoints.values()),
            "revisions": {rev: c.to_dict() for rev, c in sorted(revisions.items())},
            "workers": len(views)}


# --- /metrics ---

def _with_label(line: str, label: str) -> str | None:
    """A sample line with `label` (`name="value"`) added first; None if not a sample."""
    match = _NAME.match(line)
    if match is None:
        return None
    end = match.end()
    if line[end:end + 1] == "{":
        rest = line[end + 1:]
        sep = "" if rest.lstrip().startswith("}") else ","
        return f"{line[:end]}{{{label}{sep}{rest}"
    return f"{line[:end]}{{{label}}}{line[end:]}"


def merge_metrics(texts: Iterable[tuple[int, str]], down: Iterable[int] = ()) -> str:
    """Prometheus text of several workers, `(index, text)`, as one exposition: each
    family once (its HELP/TYPE from the first worker that has it), then every worker's
    samples of it labelled `worker="<index>"`; and `kvfleet_router_worker_up`, 1 for each
    worker given and 0 for each in `down`. No value is re-read or re-written."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    up: list[int] = []
    for index, text in texts:
        up.append(index)
        label = f'{WORKER_LABEL}="{index}"'
        family: str | None = None
        has_header = False
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    if parts[2] != family:  # a new family starts at its HELP (or TYPE)
                        family = parts[2]
                        has_header = family in headers
                        samples.setdefault(family, [])
                        headers.setdefault(family, [])
                    if not has_header:
                        headers[family].append(line)
                continue
            labelled = _with_label(line, label)
            if labelled is None:
                continue
            if family is None:  # a sample with no HELP/TYPE before it: its own family
                name = _NAME.match(line).group()  # type: ignore[union-attr]
                samples.setdefault(name, [])
                headers.setdefault(name, [])
                samples[name].append(labelled)
            else:
                samples[family].append(labelled)
    out: list[str] = []
    for family, lines in samples.items():
        out.extend(headers[family])
        out.extend(lines)
    out.append(f"# HELP {UP_METRIC} 1 if this worker's metrics are in this answer, 0 if it "
               f"did not answer within {VIEW_TIMEOUT_S:g} s")
    out.append(f"# TYPE {UP_METRIC} gauge")
    for index in sorted([*up, *down]):
        out.append(f'{UP_METRIC}{{{WORKER_LABEL}="{index}"}} {1.0 if index in up else 0.0}')
    return "\n".join(out) + "\n"


# --- the handlers ---

class PodViews:
    """The handlers a worker's app answers /admin/config (GET) and /metrics with.
    `private`: this worker's loopback address (requests arriving there get its own
    view); `siblings`: the other workers' private URLs, in index order."""

    def __init__(self, app: RouterApp, token: str | None, siblings: list[str], index: int,
                 private: tuple[str, int] | None) -> None:
        self.app = app
        self.own_metrics = app.status.metrics_text  # before worker_app replaces it
        self.token = token
        self.siblings = list(siblings)
        self.index = index
        self.private = private
        self.session: ClientSession | None = None
        self.indexes = sibling_indexes(index, len(self.siblings))

    def is_self_request(self, request: web.Request) -> bool:
        if request.query.get(SELF_QUERY) == "self" or not self.siblings:
            return True
        if self.private is None or request.transport is None:
            return False
        sockname = request.transport.get_extra_info("sockname")
        return isinstance(sockname, tuple) and len(sockname) >= 2 \
            and sockname[1] == self.private[1]

    async def start(self, _: web.Application) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector

        self.session = ClientSession(connector=TCPConnector(limit=0),
                                     timeout=ClientTimeout(total=VIEW_TIMEOUT_S))

    async def close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    # /admin/config
    def own_config(self) -> dict[str, Any]:
        from kvfleet_router.admin import config_status

        x = self.app.exchange
        now, stale = x.clock(), x.cfg.stale_after_s
        out = config_status(self.app.store, self.app.admin.meter)
        out["worker"] = {
            "index": self.index, "exchange_id": x.id,
            # fresh peers of other pods only (a restarted sibling's old id is still ours)
            "peers_in_flight": {pid: dict(c.in_flight) for pid, c in x.peers.items()
                                if now - c.received_at <= stale and c.group != x.group},
        }
        return out

    async def _sibling_json(self, url: str, index: int) -> dict[str, Any]:
        from aiohttp import ClientError

        assert self.session is not None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with self.session.get(f"{url}/admin/config?{SELF_QUERY}=self",
                                        headers=headers) as resp:
                if resp.status != 200:
                    raise WorkerUnavailable(f"worker {index} ({url}) answered HTTP "
                                            f"{resp.status}")
                body = await resp.json(content_type=None)
        except (OSError, ClientError, ValueError) as exc:  # TimeoutError is an OSError
            raise WorkerUnavailable(f"worker {index} ({url}) did not answer within "
                                    f"{VIEW_TIMEOUT_S:g} s"
                                    if isinstance(exc, TimeoutError) else
                                    f"worker {index} ({url}): {exc}") from None
        if not isinstance(body, dict):
            raise WorkerUnavailable(f"worker {index} ({url}) answered no object")
        return body

    async def get_config(self, request: web.Request) -> web.Response:
        from aiohttp import web

        from kvfleet_router.errors import error_response

        if self.is_self_request(request):
            return web.json_response(self.own_config())
        own = self.own_config()  # read before waiting: a point in time near the others'
        try:
            others = await asyncio.gather(*(self._sibling_json(url, i) for url, i in
                                            zip(self.siblings, self.indexes, strict=True)))
        except WorkerUnavailable as exc:
            return error_response(f"the pod's view is unknown: {exc}", 503,
                                  code="worker_unavailable")
        try:
            merged = merge_config_views([own, *others])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return error_response(f"the pod's view is unknown: a worker's view is "
                                  f"malformed: {exc!r}", 503, code="worker_unavailable")
        return web.json_response(merged)

    # /metrics
    async def _sibling_metrics(self, url: str) -> str | None:
        from aiohttp import ClientError

        assert self.session is not None
        try:
            async with self.session.get(f"{url}/metrics?{SELF_QUERY}=self") as resp:
                return await resp.text() if resp.status == 200 else None
        except (OSError, ClientError, ValueError):
            return None

    async def metrics_text(self, request: web.Request) -> web.Response:
        from aiohttp import web

        own_resp = await self.own_metrics(request)  # the app's own handler, as it is
        body = own_resp.body
        if self.is_self_request(request) or own_resp.status != 200 \
                or not isinstance(body, (bytes, bytearray)):
            return own_resp
        own = bytes(body)
        got = await asyncio.gather(*(self._sibling_metrics(u) for u in self.siblings))
        answers = list(zip(self.indexes, got, strict=True))
        texts = [(self.index, own.decode())] + [(i, t) for i, t in answers if t is not None]
        down = [i for i, t in answers if t is None]
        return web.Response(body=merge_metrics(sorted(texts), down).encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})
