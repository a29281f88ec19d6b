"""Priority-group configuration of a pull consumer (ADR-42): the policies, the group name rule and
the validation of a consumer PUT's priority fields. Pure rules: the dispatch that applies them to
waiting pulls is ``jobs.pull.groups``."""

from __future__ import annotations

import re

from broker.errors import InvalidInput

NONE, OVERFLOW, PINNED, PRIORITIZED = "none", "overflow", "pinned_client", "prioritized"
POLICIES = (NONE, OVERFLOW, PINNED, PRIORITIZED)
GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=-]{1,16}$")
DEFAULT_PIN_TIMEOUT = 120.0
TIMEOUT_MAX = 365 * 24 * 3600.0


def _groups_value(raw) -> list[str] | None:
    """``priorityGroups`` as a list: a JSON list, or a string (comma-separated, form fields)."""
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        if not all(isinstance(g, str) for g in raw):
            raise InvalidInput("invalid_priority_group", "priorityGroups must be group names")
        return [g.strip() for g in raw]
    if not isinstance(raw, str):
        raise InvalidInput("invalid_priority_group", "priorityGroups must be group names")
    return [g.strip() for g in raw.split(",")]


def priority_config_parse(data, *, consumer_type: str, existing=None) -> dict:
    """Validate the priority fields of a consumer PUT against the consumer's type and (on update)
    its current configuration. Returns the model fields to set; every violation is its own 400."""
    raw_policy = data.get("priorityPolicy") if hasattr(data, "get") else None
    raw_groups = data.get("priorityGroups") if hasattr(data, "get") else None
    if hasattr(data, "getlist") and raw_groups is not None and len(data.getlist("priorityGroups")) > 1:
        raw_groups = data.getlist("priorityGroups")  # repeated form field
    raw_timeout = data.get("priorityTimeout") if hasattr(data, "get") else None
    if raw_policy is None and raw_groups is None and raw_timeout is None:
        if existing is not None and existing.priority_policy != NONE and consumer_type != "pull":
            raise InvalidInput("priority_policy_on_push", "priority groups can not be used with push consumers")
        return {}
    if raw_policy is not None and not isinstance(raw_policy, str):
        raise InvalidInput("invalid_priority_policy", f"priorityPolicy must be one of {', '.join(POLICIES)}")
    policy = raw_policy.strip() if isinstance(raw_policy, str) else None
    if policy == "":
        policy = NONE
    if policy is not None and policy not in POLICIES:
        raise InvalidInput("invalid_priority_policy", f"priorityPolicy must be one of {', '.join(POLICIES)}")
    groups = _groups_value(raw_groups)
    if groups == [""] and isinstance(raw_groups, str) and policy in (None, NONE):
        groups = []  # an empty form field means "no groups"
    timeout = None
    if raw_timeout is not None and not (isinstance(raw_timeout, str) and raw_timeout.strip() == ""):
        try:
            timeout = float(raw_timeout)
        except (TypeError, ValueError):
            raise InvalidInput("invalid_priority_timeout", "priorityTimeout must be seconds") from None
        if isinstance(raw_timeout, bool) or not 0 < timeout <= TIMEOUT_MAX:
            raise InvalidInput("invalid_priority_timeout", "priorityTimeout must be a positive number of seconds")

    current_policy = existing.priority_policy if existing is not None else NONE
    effective = policy if policy is not None else current_policy
    if effective != NONE and consumer_type != "pull":
        raise InvalidInput("priority_policy_on_push", "priority groups can not be used with push consumers")
    if effective == NONE:
        if groups:
            raise InvalidInput("priority_groups_without_policy",
                               "consumer can not have priority groups when policy is none")
        if timeout is not None:
            raise InvalidInput("priority_timeout_without_policy",
                               "priorityTimeout cannot be set when priorityPolicy is none")
    else:
        if groups is None and existing is None:
            groups = []
        if groups is not None:
            if not groups:
                raise InvalidInput("priority_group_required",
                                   "setting priorityPolicy requires at least one priority group")
            for g in groups:
                if g == "":
                    raise InvalidInput("priority_group_empty", "group name cannot be an empty string")
                if not GROUP_NAME.match(g):
                    raise InvalidInput("invalid_priority_group",
                                       "valid priority group name must match A-Z, a-z, 0-9, -_/= and may not exceed "
                                       "16 characters")
            if len(groups) > 1:
                raise InvalidInput("too_many_priority_groups", "only one priority group is supported")
    if existing is not None:  # only priorityTimeout may change once the consumer exists
        if effective != current_policy:
            raise InvalidInput("priority_policy_immutable",
                               "the priority policy of an existing consumer cannot be changed")
        if groups is not None and groups != list(existing.priority_groups or []):
            raise InvalidInput("priority_groups_immutable",
                               "the priority groups of an existing consumer cannot be changed")
        return {"priority_timeout": timeout} if timeout is not None else {}
    if effective == PINNED and timeout is None:
        timeout = DEFAULT_PIN_TIMEOUT
    return {"priority_policy": effective, "priority_groups": groups or [], "priority_timeout": timeout}
