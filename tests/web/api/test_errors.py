"""Domain errors and their one HTTP mapping (DB-free): each class answers with its status, the
JSON error body and, for the retry-later ones, Retry-After."""

from __future__ import annotations

import inspect

import pytest

from broker import errors
from web.api.errors import domain_error_response, exception_handler, status_for

EXPECTED = {
    errors.InvalidInput: 400, errors.Unauthenticated: 401, errors.Forbidden: 403, errors.NotFound: 404,
    errors.Conflict: 409, errors.PreconditionFailed: 412, errors.TooLarge: 413,
    errors.UnsupportedMediaType: 415, errors.Unprocessable: 422, errors.Locked: 423, errors.RateLimited: 429,
    errors.Unavailable: 503,
}


def _make(cls, code="some_code", detail="some detail"):
    if cls in (errors.RateLimited, errors.Unavailable):
        return cls(code, detail, retry_after=7)
    return cls(code, detail)


def test_every_domain_error_class_has_its_status():
    declared = {cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                if issubclass(cls, errors.DomainError) and cls is not errors.DomainError}
    assert declared == set(EXPECTED)
    for cls, status in EXPECTED.items():
        assert status_for(_make(cls)) == status, cls.__name__


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_answer_is_the_json_error_body(cls):  # (Unprocessable adds "path" when it has one: tests/eventtypes)
    response = exception_handler(_make(cls, "thing_wrong", "the thing is wrong"), {})
    assert response.status_code == EXPECTED[cls]
    assert response.data == {"error": "thing_wrong", "detail": "the thing is wrong"}
    if cls in (errors.RateLimited, errors.Unavailable):
        assert response["Retry-After"] == "7"
    else:
        assert not response.has_header("Retry-After")


def test_subclass_answers_as_its_ancestor_and_keeps_extra_headers():
    class GatePassed(errors.Conflict):
        pass

    exc = GatePassed("gate_passed", "too late", headers={"X-Extra": "1"})
    response = domain_error_response(exc)
    assert response.status_code == 409
    assert response["X-Extra"] == "1"


def test_rate_limited_keeps_retry_after_as_given():
    exc = errors.RateLimited("rate_limited", "slow down", retry_after=3)
    assert exc.retry_after == 3 and exc.code == "rate_limited" and str(exc) == "slow down"
    assert domain_error_response(exc)["Retry-After"] == "3"


def test_an_unprocessable_payload_names_the_place():
    response = exception_handler(errors.Unprocessable("schema_validation_failed", "no", path="/a/0"), {})
    assert response.status_code == 422
    assert response.data == {"error": "schema_validation_failed", "detail": "no", "path": "/a/0"}
    assert "path" not in exception_handler(errors.Unprocessable("unknown_event_type", "no"), {}).data
