"""One error shape for every endpoint: ``{"error": code, "detail": text}`` with a 4xx status."""

from __future__ import annotations

import logging
import sys

from django.db import connection
from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers, status
from rest_framework.response import Response

from broker import errors
from broker.db.errors import database_read_only, database_refused_value, database_unavailable

logger = logging.getLogger("broker.api.errors")  # its name before the move: what operators filter on
DATABASE_RETRY_AFTER = 1  # seconds: a failover or a cut connection is over in a few


class ErrorSerializer(serializers.Serializer):
    """The one error body (OpenAPI component ``Error``)."""

    error = serializers.CharField(help_text="machine-readable code, e.g. channel_not_found")
    detail = serializers.CharField(help_text="human-readable explanation")
    path = serializers.CharField(required=False, help_text="schema_validation_failed: JSON pointer of the fault in "
                                                           "the payload (empty: the payload itself)")


ERROR_RESPONSE = OpenApiResponse(ErrorSerializer, description='{"error": code, "detail": text}')
_ERROR_SCHEMA = {"type": "object", "required": ["error", "detail"],
                 "properties": {"error": {"type": "string"}, "detail": {"type": "string"}, "path": {"type": "string"}}}
# Paths the HMAC signature check never applies to (its default BROKER_HMAC_EXEMPT_PATHS).
_UNSIGNED_PATHS = ("/_status", "/metrics", "/api/")


def schema_common_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: answers any endpoint can give, documented once.

    Every operation may answer 503 (database unavailable, ``Retry-After``); with HMAC request
    signing on (``BROKER_HMAC_SECRET``) every signed path may answer 401 / 403 before its view runs.
    """
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", _ERROR_SCHEMA)
    body = {"description": '{"error": code, "detail": text}',
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            codes = ["503"] if path.startswith(_UNSIGNED_PATHS) else ["401", "403", "503"]
            for code in codes:
                responses.setdefault(code, body)
    return result


# The one place domain errors become HTTP: each class's status (a subclass answers as its nearest
# listed ancestor; a bare DomainError is bad input).
STATUS = {
    errors.InvalidInput: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PreconditionFailed: 412,
    errors.TooLarge: 413,
    errors.Unprocessable: 422,
    errors.UnsupportedMediaType: 415,
    errors.Locked: 423,
    errors.RateLimited: 429,
    errors.Unavailable: 503,
    errors.DomainError: 400,
}


def status_for(exc: errors.DomainError) -> int:
    """The HTTP status of a domain error (``STATUS``, by the class's nearest listed ancestor)."""
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


def domain_error_response(exc: errors.DomainError) -> Response:
    """The JSON error answer of a domain error, with its headers (``Retry-After`` when it has one)."""
    headers = dict(exc.headers)
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    response = error_response(status_for(exc), exc.code, exc.detail, headers)
    path = getattr(exc, "path", None)
    if path is not None:  # where in the input (a JSON pointer): schema_validation_failed
        response.data["path"] = path
    return response


def error_response(status_code: int, code: str, detail: str, headers: dict | None = None) -> Response:
    response = Response({"error": code, "detail": detail}, status=status_code)
    for key, value in (headers or {}).items():
        response[key] = value
    return response


_DRF_CODES = {
    drf_exceptions.ParseError: "malformed_request",
    drf_exceptions.UnsupportedMediaType: "unsupported_media_type",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.NotAcceptable: "not_acceptable",
    drf_exceptions.Throttled: "rate_limited",
    drf_exceptions.ValidationError: "invalid_request",
    drf_exceptions.NotAuthenticated: "unauthorized",
    drf_exceptions.AuthenticationFailed: "unauthorized",
    drf_exceptions.PermissionDenied: "forbidden",
}


def exception_handler(exc, context):
    if isinstance(exc, errors.DomainError):
        return domain_error_response(exc)
    if isinstance(exc, drf_exceptions.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
        detail = exc.detail
        if isinstance(detail, (list, dict)):
            detail = str(detail)
        headers = {}
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        return error_response(exc.status_code, code, str(detail), headers)
    if database_unavailable(exc):
        return database_unavailable_response(exc)
    if database_refused_value(exc):  # e.g. an id or a name holding NUL: checked where stored, not at every lookup
        logger.info("a value of the request was refused by the database: %s", exc)
        return error_response(status.HTTP_400_BAD_REQUEST, "invalid_input",
                              "a value holds a NUL character or is not valid UTF-8, or is out of range")
    if isinstance(exc, RecursionError):
        return error_response(status.HTTP_400_BAD_REQUEST, "malformed_request", "input is nested too deeply")
    if isinstance(exc, UnicodeDecodeError):
        return error_response(status.HTTP_400_BAD_REQUEST, "malformed_request", "request is not valid UTF-8")
    return None


def bad_request_view(request, exception=None):
    return JsonResponse({"error": "bad_request", "detail": "bad request"}, status=400)


def forbidden_view(request, exception=None):
    return JsonResponse({"error": "forbidden", "detail": "forbidden"}, status=403)


def not_found_view(request, exception=None):
    return JsonResponse({"error": "not_found", "detail": "no such resource"}, status=404)


def database_unavailable_response(exc: BaseException) -> Response:
    """503 ``database_unavailable`` with ``Retry-After``: the database is down, unreachable, failing
    over or read-only (``broker.db.errors.database_unavailable``); clients retry, never a 201. A
    connection that landed on a read-only server is dropped, so the next request connects again
    (``target_session_attrs=read-write`` then finds the primary)."""
    logger.warning("database unavailable: %s", type(exc).__name__)
    if database_read_only(exc):
        connection.close()
    return domain_error_response(errors.Unavailable("database_unavailable", "the database is unavailable, retry shortly",
                                                    retry_after=DATABASE_RETRY_AFTER))


def server_error_view(request):
    """handler500. Django calls it while handling the exception, so a database outage met outside
    DRF (admin pages, /_status, /metrics, a middleware) is still the 503 it is, not a 500."""
    exc = sys.exc_info()[1]
    if exc is not None and database_unavailable(exc):
        drf = database_unavailable_response(exc)
        return JsonResponse(drf.data, status=drf.status_code, headers={"Retry-After": drf["Retry-After"]})
    return JsonResponse({"error": "internal_error", "detail": "internal server error"}, status=500)
