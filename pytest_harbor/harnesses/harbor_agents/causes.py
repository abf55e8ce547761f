"""Why a Harbor agent's turn failed, from the type of what its `run()` raised."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Final

from pytest_harbor.agent_outcomes import AgentCause

__all__ = ["CAUSES", "CRASHED", "cause_of"]

#: The cause of an exception CAUSES does not name.
CRASHED: Final[AgentCause] = "agent_crashed"

#: The exceptions that say more than a crash, by import path: Harbor's own (its installed
#: agents read their CLI's output into them; its LiteLLM client raises the context-length
#: one), and LiteLLM's, whose errors terminus-2 lets through after its own retries.
#: Matched by exact type: any other exception, a subclass of one of these included, is
#: CRASHED (Harbor's other ApiError subclasses, a safety refusal or an exhausted quota
#: among them, are no passing fault of the endpoint).
CAUSES: Final[Mapping[str, AgentCause]] = {
    "harbor.agents.installed.base:ApiRateLimitError": "rate_limited",
    "harbor.agents.installed.base:ContextWindowExceededError": "context_length_exceeded",
    "harbor.agents.installed.base:ApiError": "api_error",
    "harbor.agents.installed.base:ApiConnectionClosedError": "api_error",
    "harbor.agents.installed.base:UnknownApiError": "api_error",
    "harbor.agents.installed.vibe:ApiConnectionError": "api_error",
    "harbor.llms.base:ContextLengthExceededError": "context_length_exceeded",
    "litellm.exceptions:RateLimitError": "rate_limited",
    "litellm.exceptions:CallerCredentialRateLimitError": "rate_limited",
    "litellm.exceptions:ContextWindowExceededError": "context_length_exceeded",
    "litellm.exceptions:APIError": "api_error",
    "litellm.exceptions:APIConnectionError": "api_error",
    "litellm.exceptions:ServiceUnavailableError": "api_error",
}


def cause_of(error: BaseException) -> AgentCause:
    """The cause CAUSES gives the type of `error`, else CRASHED."""
    kind = type(error)
    for path, cause in CAUSES.items():
        module, _, name = path.partition(":")
        # Looked up among the modules loaded: one that is not raised nothing, and loading
        # it to find out (LiteLLM takes seconds) would tell nothing more.
        if getattr(sys.modules.get(module), name, None) is kind:
            return cause
    return CRASHED
