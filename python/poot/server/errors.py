"""Errors as OpenAI shapes them: ``{"error": {"message", "type", "param", "code"}}``.

Every error the server answers goes through ``APIError``: bad input, a refused request, a
failed step. ``from_exception`` maps poot's typed errors to a status and a code, so a client
can tell "fix your request" (4xx) from "the server cannot serve now" (429/503) from a bug
(500, logged with its traceback). ``validation_error`` does the same for pydantic-core's
validation errors (malformed JSON, wrong types, unknown fields), and ``exception_handlers``
for Starlette's own (unknown routes, wrong methods) and anything a route leaves unhandled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from poot import errors as perr
from poot.async_engine import EngineClosedError

__all__ = ["APIError", "error_body", "exception_handlers", "from_exception", "validation_error"]

logger = logging.getLogger("poot.server")

INVALID = "invalid_request_error"
SERVER = "server_error"


class APIError(Exception):
    """An error answered to the client in OpenAI's shape.

    Attributes:
        status: the HTTP status.
        message: what went wrong, for a person.
        type: OpenAI's error type (``invalid_request_error``, ``server_error``, ...).
        param: the request field concerned, if any.
        code: a stable machine-readable code, if any.
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, type: str = INVALID, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_exception(exc: BaseException, *, prompt_param: str = "prompt") -> APIError:
    """The ``APIError`` for an exception a request's generation raised."""
    if isinstance(exc, APIError):
        return exc
    msg = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, perr.SamplingParamsError):
        return APIError(400, msg, param=exc.field or None, code="invalid_value")
    if isinstance(exc, perr.ContextLengthError):
        return APIError(400, msg, param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, perr.ChatTemplateError):
        return APIError(400, msg, param="messages", code="chat_template_error")
    if isinstance(exc, perr.GraphInputError):
        return APIError(400, msg, param=prompt_param, code="invalid_value")
    if isinstance(exc, perr.DeviceTimeoutError | perr.RuntimePoisonedError):
        return APIError(503, msg, type=SERVER, code="runtime_dead")
    if isinstance(exc, EngineClosedError):
        return APIError(503, msg, type=SERVER, code="shutting_down")
    if isinstance(exc, perr.PreparedEntryLimitError | perr.DeviceMemoryError):
        return APIError(503, msg, type=SERVER, code="resource_limit")
    if isinstance(exc, perr.PootError) and isinstance(exc, ValueError):
        return APIError(400, msg, code="invalid_value")
    logger.error("internal error", exc_info=exc)
    return APIError(500, f"internal error: {msg}", type=SERVER, code="internal_error")


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def validation_error(errors: Sequence[Any]) -> APIError:
    """The ``APIError`` for pydantic-core's validation errors (the first one is reported)."""
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    kind = str(first.get("type", ""))
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # Union members add their type name to the location (``prompt.str``); drop those parts.
    loc = [p for p in loc if not (p in _TYPE_TAGS or "[" in p or p.startswith("function-"))]
    param = ".".join(loc) or None
    if kind == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    if kind == "missing" and param is None:
        return APIError(400, "the request needs a JSON body", code="invalid_json")
    if kind in ("model_type", "model_attributes_type") and param is None:
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        return APIError(
            400,
            f"unrecognized request argument supplied: {param}",
            param=param,
            code="unknown_parameter",
        )
    where = f"{param}: " if param else ""
    return APIError(
        400, f"{where}{first.get('msg', 'invalid value')}", param=param, code="invalid_value"
    )


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return APIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()


async def _internal(_: Request, exc: Exception) -> JSONResponse:
    return from_exception(exc).response()


def exception_handlers() -> dict[Any, Any]:
    """Starlette's ``exception_handlers``: every error raised in a route answered in OpenAI's
    shape (an unhandled one as a 500, which Starlette then re-raises to be logged)."""
    return {APIError: _api_error, StarletteHTTPException: _http_error, Exception: _internal}
