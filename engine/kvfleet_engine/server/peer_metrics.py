"""Prometheus figures of peer prefix sharing (names in `contract.peer_prefix`).

Importing side: one `kvfleet:peer_fetch_total{outcome}` per request that carried a hint
(every outcome is exported from start-up, at 0), the blocks, tokens and bytes that came
in, and how long successful fetches took (bytes over seconds is the peer bandwidth a
router can estimate); for fetches that timed out, the bytes they asked for and the seconds
they waited (their ratio bounds that bandwidth from above: a slow link where every fetch
times out still teaches the router). Exporting side: blocks and bytes served to peers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from kvfleet_engine.contract import MODEL_LABEL
from kvfleet_engine.contract import peer_prefix as pp

FETCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                 30.0, 60.0)


class PeerPrefixMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = [MODEL_LABEL]
        self._model = model_name
        self._fetch = Counter(pp.PEER_FETCH, "Requests that carried a peer-prefix hint, by "
                              "outcome.", [MODEL_LABEL, pp.OUTCOME_LABEL], registry=registry)
        for outcome in pp.OUTCOMES:
            self._fetch.labels(model_name, outcome)
        self.blocks = Counter(pp.PEER_FETCH_BLOCKS, "Blocks fetched from peers and installed.",
                              labels, registry=registry).labels(model_name)
        self.tokens = Counter(pp.PEER_FETCH_TOKENS, "Prompt tokens held by blocks fetched "
                              "from peers and installed.", labels,
                              registry=registry).labels(model_name)
        self.bytes = Counter(pp.PEER_FETCH_BYTES, "KV payload bytes received from peers.",
                             labels, registry=registry).labels(model_name)
        self.seconds = Histogram(pp.PEER_FETCH_SECONDS, "Duration of successful peer-prefix "
                                 "fetches.", labels, registry=registry,
                                 buckets=FETCH_BUCKETS).labels(model_name)
        self.timeout_bytes = Counter(pp.PEER_FETCH_TIMEOUT_BYTES, "KV payload bytes asked for "
                                     "by peer-prefix fetches that timed out.", labels,
                                     registry=registry).labels(model_name)
        self.timeout_seconds = Counter(pp.PEER_FETCH_TIMEOUT_SECONDS, "Seconds peer-prefix "
                                       "fetches that timed out waited.", labels,
                                       registry=registry).labels(model_name)
        self.export_blocks = Counter(pp.PEER_EXPORT_BLOCKS, "Cached blocks exported to peers.",
                                     labels, registry=registry).labels(model_name)
        self.export_bytes = Counter(pp.PEER_EXPORT_BYTES, "KV payload bytes exported to peers.",
                                    labels, registry=registry).labels(model_name)

    def count(self, outcome: str) -> None:
        self._fetch.labels(self._model, outcome).inc()
