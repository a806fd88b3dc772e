"""Whose fault an engine's answer is: the outlier-detection rule, in one place.

Passive outlier detection must never be a lever a client can pull: if a request that is
bad everywhere counted against the endpoint that answered it, a few such requests would
eject every healthy endpoint of a pool. So only the endpoint's own faults count:

| what happened                                     | verdict    | retried | counts |
|---------------------------------------------------|------------|---------|--------|
| connect refused/reset, timeout, broken stream     | `endpoint` | yes*    | yes    |
| 500, 502, 504 (not marked as caused by request)   | `endpoint` | yes     | yes    |
| 429, 503 (overloaded or draining)                 | `busy`     | yes     | no     |
| any 4xx other than 429                            | `client`   | no      | no     |
| 500/502/504 whose error says `code: "caused_by_request"` | `client` | no | no |
| any other 5xx (501, 505, ...)                     | `client`   | no      | no     |
| 1xx-3xx                                           | `ok`       | -       | success |

(* retried only while no byte reached the client.) `caused_by_request` is the engine's
word that the request itself broke it (and would anywhere); kvfleet engines send it. A
`client` answer is passed through to the client unchanged and teaches the endpoint's
learners nothing (no success either: a 400 proves little about an endpoint's health).
The rule is written down in docs/security.md.
"""

from __future__ import annotations

from kvfleet_engine.contract.http_limits import REQUEST_CAUSED_CODE, JSONRejected, strict_loads

OK, BUSY, CLIENT, ENDPOINT = "ok", "busy", "client", "endpoint"
BUSY_STATUSES = frozenset({429, 503})
ENDPOINT_STATUSES = frozenset({500, 502, 504})
MAX_ERROR_BODY = 64 * 1024  # a longer error body is not inspected for the marker


def is_request_caused(body: bytes) -> bool:
    """True when an OpenAI error body says the request itself caused the failure."""
    if len(body) > MAX_ERROR_BODY:
        return False
    try:
        data = strict_loads(body)
    except JSONRejected:
        return False
    err = data.get("error") if isinstance(data, dict) else None
    return isinstance(err, dict) and err.get("code") == REQUEST_CAUSED_CODE


def classify(status: int, body: bytes) -> str:
    """The verdict on one answer (see the table above)."""
    if status < 400:
        return OK
    if status in BUSY_STATUSES:
        return BUSY
    if status in ENDPOINT_STATUSES and not is_request_caused(body):
        return ENDPOINT
    return CLIENT
