"""OpenAI-shaped error responses: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from kvfleet_router.request_error import RequestError as RequestError  # re-exported

log = logging.getLogger(__name__)


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          408: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error",
          429: "rate_limit_error"}


def error_body(message: str, status: int, param: str | None = None,
               code: str | None = None) -> dict[str, object]:
    err_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": err_type, "param": param,
                      "code": code if code is not None else status}}


def error_response(message: str, status: int, param: str | None = None,
                   code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, headers=headers, content_type="application/json",
                        text=json.dumps(error_body(message, status, param, code)))


def openai_error(message: str, status: int, err_type: str, code: str | None,
                 param: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    """An error whose `type` and `code` are OpenAI's own for the case, not the status's:
    `rate_limit_exceeded` has type `requests` or `tokens`; a bad API key is an
    `invalid_request_error` (code `invalid_api_key`, or null when no key was sent)."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return web.Response(status=status, headers=headers, content_type="application/json",
                        text=json.dumps(body))


def sse_error_event(message: str, status: int = 502, code: str = "backend_error") -> bytes:
    """The event a broken stream ends with; the openai client raises APIError on it."""
    return b"data: " + json.dumps(error_body(message, status, None, code)).encode() + \
        b"\n\ndata: [DONE]\n\n"


@web.middleware
async def json_errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Every error, a bug included, answers in OpenAI's shape (and a bug is logged)."""
    try:
        return await handler(request)
    except RequestError as exc:
        resp = error_response(str(exc), exc.status, exc.param, exc.code, exc.headers)
        if exc.is_closing:
            resp.force_close()
        return resp
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.reason, exc.status)
    except Exception:
        log.exception("unexpected error serving %s", request.path)
        return error_response("internal router error", 500, code="internal_error")
