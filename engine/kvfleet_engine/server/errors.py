"""OpenAI-shaped HTTP errors: `{"error": {"message", "type", "param", "code"}}`.

Handlers raise `APIError`; one middleware turns it (and aiohttp's own HTTP errors,
and anything unexpected) into that shape, so a client never sees a traceback.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from kvfleet_engine.contract.http_limits import REQUEST_CAUSED_CODE

log = logging.getLogger(__name__)

# error `type` values, as OpenAI's API and client use them
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
OVERLOADED = "overloaded_error"
KV_TRANSFER = "kv_transfer_error"
AUTHENTICATION = "authentication_error"

# status -> default type when aiohttp raises its own HTTP error (404 route, 405 method...)
_TYPE_BY_STATUS = {400: INVALID_REQUEST, 404: NOT_FOUND, 405: INVALID_REQUEST, 413: INVALID_REQUEST}


class APIError(Exception):
    """An error that reaches the client as one JSON object with a status code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        is_closing: bool = False,  # close the connection after answering (body left unread)
    ) -> None:
        super().__init__(message)
        self.is_closing = is_closing
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None  # noqa: A002
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def request_caused(exc: BaseException) -> APIError:
    """A 500 that this request's own content caused (an unexpected error while reading,
    validating or tokenizing it, before it reached the engine): the reply carries
    `code: "caused_by_request"`, so a router never counts it against this replica."""
    log.warning("request refused by an unexpected %s: %.200s", type(exc).__name__, exc)
    log.debug("traceback of the refused request", exc_info=exc)
    return APIError(500, f"this request could not be processed ({type(exc).__name__})",
                    type=SERVER_ERROR, code=REQUEST_CAUSED_CODE)


def check_bearer(authorization: str | None, token: str) -> None:
    """401 unless the Authorization header carries `token` (no check when token is "")."""
    if not token:
        return
    expected = f"Bearer {token}".encode()
    if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
        raise APIError(401, "a valid bearer token is required for this endpoint",
                       type=AUTHENTICATION, code="invalid_token",
                       headers={"WWW-Authenticate": "Bearer"})


def type_for_status(status: int) -> str:
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return SERVER_ERROR if status >= 500 else INVALID_REQUEST
