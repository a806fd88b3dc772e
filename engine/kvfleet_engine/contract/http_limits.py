"""What the engine and the router both refuse in a client body, and how they count uploads.

Both servers parse client JSON with `strict_loads`, so a body the router lets through is
one the engine can parse too, and neither can be made to recurse or to spend quadratic
time on a number. Before `json.loads` runs, one cheap pass over the raw bytes (strings
cut out by one regex, then a running sum over the brackets alone) rejects:

- nesting deeper than `MAX_JSON_DEPTH` (64) arrays/objects;
- a run of more than `MAX_NUMBER_DIGITS` (64) digits outside strings (Python's int parser
  is quadratic in the digit count and refuses 4300+ digits with a ValueError);

and the parse itself rejects `NaN`, `Infinity` and `-Infinity` (not JSON). Every refusal
is a `JSONRejected` (a ValueError) with a one-line message and an OpenAI error `code`.
Floats too large for a double become `inf` and are caught by each field's range check.

`UploadSlots` caps the request bodies one client address may have unfinished at once;
the servers also bound the time a body may take to arrive (see docs/security.md).
Stdlib only: the router imports this.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 64
MAX_NUMBER_DIGITS = 64
DEFAULT_BODY_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_UPLOADS_PER_CLIENT = 64  # the router's, per tenant address
# An engine's usual client is a router, one address for every tenant: a higher default.
DEFAULT_ENGINE_MAX_UPLOADS_PER_CLIENT = 256
# The OpenAI error `code` of a 5xx that the request itself caused (the engine says so):
# a router passes it through and never counts it against the endpoint's health.
REQUEST_CAUSED_CODE = "caused_by_request"

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_DELTA = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JSONRejected(ValueError):
    """A body refused before or while parsing; `code` is the OpenAI error code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _no_constants(name: str) -> Any:
    raise JSONRejected(f"{name} is not a valid JSON number", "invalid_json")


def check_shape(raw: bytes, max_depth: int = MAX_JSON_DEPTH,
                max_digits: int = MAX_NUMBER_DIGITS) -> None:
    """Raise JSONRejected if `raw` nests too deep or holds an over-long number."""
    skeleton = _STRING.sub(b'""', raw)  # brackets and digits inside strings are text
    if skeleton.count(b"[") + skeleton.count(b"{") > max_depth:  # else it cannot be too deep
        brackets = skeleton.translate(None, _NOT_BRACKETS)
        depth = max(accumulate(map(_DELTA.__getitem__, brackets)), default=0)
        if depth > max_depth:
            raise JSONRejected(f"JSON nesting deeper than {max_depth} levels", "json_too_deep")
    if re.search(rb"\d{%d}" % (max_digits + 1), skeleton):
        raise JSONRejected(f"a JSON number has more than {max_digits} digits",
                           "number_too_long")


def strict_loads(raw: bytes, max_depth: int = MAX_JSON_DEPTH,
                 max_digits: int = MAX_NUMBER_DIGITS) -> Any:
    """`json.loads` behind `check_shape`; every failure is a JSONRejected."""
    check_shape(raw, max_depth, max_digits)
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except JSONRejected:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, int limits
        raise JSONRejected(f"malformed JSON body: {exc}", "invalid_json") from None


class UploadSlots:
    """Unfinished body uploads per client address, at most `max_per_client` at once.

        if not slots.acquire(addr): answer 429 (without reading the body)
        try: read the body
        finally: slots.release(addr)
    """

    def __init__(self, max_per_client: int) -> None:
        if max_per_client < 1:
            raise ValueError("max uploads per client must be at least 1")
        self.max_per_client = max_per_client
        self._counts: dict[str, int] = {}

    def acquire(self, addr: str) -> bool:
        num = self._counts.get(addr, 0)
        if num >= self.max_per_client:
            return False
        self._counts[addr] = num + 1
        return True

    def release(self, addr: str) -> None:
        num = self._counts.get(addr, 0) - 1
        if num > 0:
            self._counts[addr] = num
        else:
            self._counts.pop(addr, None)

    def in_use(self, addr: str) -> int:
        return self._counts.get(addr, 0)
