"""Priority-group configuration of a consumer PUT (ADR-42), without a database: every rule of
``consumers.priority.priority_config_parse`` on a create and on an update."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.http import QueryDict
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import InvalidInput
from consumers.priority import (DEFAULT_PIN_TIMEOUT, GROUP_NAME, NONE, OVERFLOW, PINNED, POLICIES, TIMEOUT_MAX,
                                priority_config_parse)


def _parse(data, consumer_type="pull", existing=None):
    return priority_config_parse(data, consumer_type=consumer_type, existing=existing)


def _existing(policy=NONE, groups=None, timeout=None):
    return SimpleNamespace(priority_policy=policy, priority_groups=groups or [], priority_timeout=timeout)


def test_no_priority_fields_change_nothing():
    assert _parse({}) == {}
    assert _parse({}, "push") == {}
    assert _parse({}, existing=_existing(PINNED, ["g"])) == {}


def test_creates():
    assert _parse({"priorityPolicy": "overflow", "priorityGroups": ["g1"]}) == {
        "priority_policy": OVERFLOW, "priority_groups": ["g1"], "priority_timeout": None}
    assert _parse({"priorityPolicy": " pinned_client ", "priorityGroups": " a/b=c_-9 "}) == {
        "priority_policy": PINNED, "priority_groups": ["a/b=c_-9"], "priority_timeout": DEFAULT_PIN_TIMEOUT}
    assert _parse({"priorityPolicy": "pinned_client", "priorityGroups": "g", "priorityTimeout": "2.5"})[
        "priority_timeout"] == 2.5
    assert _parse({"priorityPolicy": "", "priorityGroups": ""}) == {
        "priority_policy": NONE, "priority_groups": [], "priority_timeout": None}, "empty form fields mean none"


def test_repeated_form_fields_are_a_list():
    data = QueryDict("priorityPolicy=overflow&priorityGroups=a&priorityGroups=b")
    with pytest.raises(InvalidInput) as e:
        _parse(data)
    assert e.value.code == "too_many_priority_groups"


@pytest.mark.parametrize("data, consumer_type, code", [
    ({"priorityPolicy": "fastest"}, "pull", "invalid_priority_policy"),
    ({"priorityPolicy": 3}, "pull", "invalid_priority_policy"),
    ({"priorityPolicy": "overflow", "priorityGroups": ["g"]}, "push", "priority_policy_on_push"),
    ({"priorityGroups": ["g"]}, "pull", "priority_groups_without_policy"),
    ({"priorityTimeout": 5}, "pull", "priority_timeout_without_policy"),
    ({"priorityPolicy": "overflow"}, "pull", "priority_group_required"),
    ({"priorityPolicy": "overflow", "priorityGroups": []}, "pull", "priority_group_required"),
    ({"priorityPolicy": "overflow", "priorityGroups": ["g", ""]}, "pull", "priority_group_empty"),
    ({"priorityPolicy": "overflow", "priorityGroups": ["x" * 17]}, "pull", "invalid_priority_group"),
    ({"priorityPolicy": "overflow", "priorityGroups": ["a b"]}, "pull", "invalid_priority_group"),
    ({"priorityPolicy": "overflow", "priorityGroups": [1]}, "pull", "invalid_priority_group"),
    ({"priorityPolicy": "overflow", "priorityGroups": 7}, "pull", "invalid_priority_group"),
    ({"priorityPolicy": "overflow", "priorityGroups": "a,b"}, "pull", "too_many_priority_groups"),
    ({"priorityPolicy": "pinned_client", "priorityGroups": "g", "priorityTimeout": "soon"}, "pull",
     "invalid_priority_timeout"),
    ({"priorityPolicy": "pinned_client", "priorityGroups": "g", "priorityTimeout": 0}, "pull",
     "invalid_priority_timeout"),
    ({"priorityPolicy": "pinned_client", "priorityGroups": "g", "priorityTimeout": TIMEOUT_MAX + 1}, "pull",
     "invalid_priority_timeout"),
    ({"priorityPolicy": "pinned_client", "priorityGroups": "g", "priorityTimeout": True}, "pull",
     "invalid_priority_timeout"),
])
def test_bad_creates(data, consumer_type, code):
    with pytest.raises(InvalidInput) as e:
        _parse(data, consumer_type)
    assert e.value.code == code


def test_updates_may_change_only_the_timeout():
    pinned = _existing(PINNED, ["g"], 60.0)
    assert _parse({"priorityTimeout": 30}, existing=pinned) == {"priority_timeout": 30.0}
    assert _parse({"priorityPolicy": "pinned_client", "priorityGroups": ["g"]}, existing=pinned) == {}
    for data, code in [({"priorityPolicy": "overflow"}, "priority_policy_immutable"),
                       ({"priorityPolicy": "none"}, "priority_policy_immutable"),
                       ({"priorityGroups": ["h"]}, "priority_groups_immutable")]:
        with pytest.raises(InvalidInput) as e:
            _parse(data, existing=pinned)
        assert e.value.code == code
    with pytest.raises(InvalidInput) as e:
        _parse({"priorityPolicy": "overflow", "priorityGroups": ["g"]}, existing=_existing())
    assert e.value.code == "priority_policy_immutable"


def test_a_pull_consumer_with_a_policy_cannot_turn_push():
    with pytest.raises(InvalidInput) as e:
        _parse({}, "push", existing=_existing(OVERFLOW, ["g"]))
    assert e.value.code == "priority_policy_on_push"


@given(st.fixed_dictionaries({}, optional={
    "priorityPolicy": st.sampled_from([*POLICIES, "", "x"]) | st.none(),
    "priorityGroups": st.lists(st.text(max_size=18), max_size=2) | st.text(max_size=18),
    "priorityTimeout": st.floats(allow_nan=True) | st.text(max_size=5) | st.integers(),
}), st.sampled_from(["pull", "push"]))
def test_any_put_is_a_valid_configuration_or_a_400(data, consumer_type):
    try:
        fields = _parse(data, consumer_type)
    except InvalidInput as exc:
        assert exc.code.startswith(("invalid_", "priority_", "too_many_"))
        return
    if not fields:
        return
    assert fields["priority_policy"] in POLICIES
    if fields["priority_policy"] == NONE:
        assert fields["priority_groups"] == [] and fields["priority_timeout"] is None
    else:
        assert consumer_type == "pull" and len(fields["priority_groups"]) == 1
        assert GROUP_NAME.match(fields["priority_groups"][0])
        assert fields["priority_timeout"] is None or 0 < fields["priority_timeout"] <= TIMEOUT_MAX
