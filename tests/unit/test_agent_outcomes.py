"""agent_outcome_policy: its defaults, how it is written, and how it sizes the backstop."""

from __future__ import annotations

import pytest

from pytest_harbor.agent_outcomes import AGENT_CAUSES, AgentOutcomePolicy, OutcomeRule
from pytest_harbor.settings import SettingsError, load_settings, parse_assignments


def test_the_default_table() -> None:
    policy = AgentOutcomePolicy()
    actions = {cause: policy.rule(cause).action for cause in AGENT_CAUSES}
    assert actions == {
        "timeout": "verify",
        "rate_limited": "retry",
        "api_error": "retry",
        "context_length_exceeded": "verify",
        "agent_crashed": "verify",
        "tools_unavailable": "fail",
    }
    assert (policy.rate_limited.retries, policy.rate_limited.backoff_s) == (2, 30.0)


def test_a_rule_is_a_word_or_a_table_and_the_pause_doubles() -> None:
    assert OutcomeRule.model_validate("fail") == OutcomeRule(action="fail")
    rule = OutcomeRule.model_validate({"action": "retry", "retries": 3, "backoff_s": 2})
    assert [rule.backoff_before(n) for n in range(3)] == [2.0, 4.0, 8.0]
    assert rule.total_backoff_s == 14.0


def test_settings_set_one_cause_and_keep_the_other_defaults() -> None:
    settings = load_settings(
        {},
        [],
        parse_assignments(
            [
                "agent_outcome_policy.rate_limited=fail",
                "agent_outcome_policy.api_error={action: retry, retries: 5, backoff_s: 1}",
            ]
        ),
    )
    policy = settings.agent_outcome_policy
    assert policy.rate_limited == OutcomeRule(action="fail")
    assert (policy.api_error.retries, policy.api_error.backoff_s) == (5, 1.0)
    assert policy.timeout.action == "verify"
    assert policy.most_retries == policy.api_error


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        (
            "agent_outcome_policy.overheated=fail",
            "setting agent_outcome_policy.overheated (from --harbor-set "
            "agent_outcome_policy.overheated=fail): no such key (it takes agent_crashed, "
            "api_error, context_length_exceeded, rate_limited, timeout, tools_unavailable)",
        ),
        (
            "agent_outcome_policy.timeout=ignore",
            "setting agent_outcome_policy.timeout.action (from --harbor-set "
            "agent_outcome_policy.timeout=ignore): Input should be 'verify', 'retry' or 'fail'",
        ),
    ],
)
def test_a_bad_policy_names_the_key(assignment: str, message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings({}, [], parse_assignments([assignment]))
    assert str(raised.value) == message


def test_no_retry_rule_no_retries() -> None:
    policy = AgentOutcomePolicy.model_validate({"rate_limited": "fail", "api_error": "verify"})
    assert policy.most_retries is None
