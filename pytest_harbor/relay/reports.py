"""What crosses between the relay's process and the run's: the relay's start, a grant's
spend and what its answers showed, the run's spend. Each is a frozen model, dumped to JSON
on one side and read back on the other."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Counts", "GrantReport", "GrantRequest", "RelayStart", "RunSpend"]


class Counts(BaseModel):
    """Model calls and what they took: tokens as the endpoint's answers counted them,
    cost priced by the relay's table. `unpriced` counts calls of a model the table does
    not price (their cost is not in `cost_usd`); `estimated` the calls whose answer gave
    no counts (cut short, or an endpoint that sends none), their tokens reckoned from their
    bytes (four to a token)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0
    estimated: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            requests=self.requests + other.requests,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            unpriced=self.unpriced + other.unpriced,
            estimated=self.estimated + other.estimated,
        )

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            requests=self.requests - other.requests,
            prompt_tokens=self.prompt_tokens - other.prompt_tokens,
            completion_tokens=self.completion_tokens - other.completion_tokens,
            cached_tokens=self.cached_tokens - other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens - other.cache_write_tokens,
            cost_usd=self.cost_usd - other.cost_usd,
            unpriced=self.unpriced - other.unpriced,
            estimated=self.estimated - other.estimated,
        )


#: The prefix of the folder a run makes for its relay's control socket; the relay removes
#: such a folder, with the socket, as it ends, so that a run killed mid-way leaves neither.
RELAY_FOLDER_PREFIX = "pytest-harbor-relay-"


class RelayStart(BaseModel):
    """What the relay's process is started with (on its input, never its command line:
    the key is in it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The model endpoint's base URL (ending in /v1, as --harbor-model-url).
    upstream: str
    #: The model's key, sent upstream only (None: the endpoint takes none).
    api_key: str | None = None
    #: The Unix socket the run's processes ask the relay through.
    control_socket: str
    #: The price table's file (None: the table shipped with pytest-harbor).
    prices: str | None = None
    #: The run's spend at which no further call is served (None: no cap).
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    #: Keep every request and answer below this folder.
    record: str | None = None
    #: Answer from the requests and answers kept below this folder, never the endpoint.
    replay: str | None = None
    #: Values masked in what is recorded (the run's secrets).
    masked: tuple[str, ...] = ()


class GrantRequest(BaseModel):
    """A token asked for one episode's attempt: the model names it may call, and the
    cassette its calls are kept in or answered from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episode: str
    models: tuple[str, ...]
    #: A relative path below the record or replay folder (the episode's own).
    cassette: str


class GrantReport(BaseModel):
    """A grant's calls so far: what they took, and what the relay saw of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    counts: Counts = Counts()
    #: The causes the endpoint's answers showed, in order (rate_limited, api_error,
    #: context_length_exceeded), each with what showed it.
    causes: tuple[tuple[str, str], ...] = ()
    #: The endpoint's failed answers, in order: each one's status (None: no answer) and
    #: its words (masked, cut short), so that the run can show them as they happen.
    errors: tuple[tuple[int | None, str], ...] = ()
    #: Calls refused because the run's budget was spent.
    refused_for_budget: int = 0
    #: Requests a replay had no answer for, named by method, path and key.
    replay_misses: tuple[str, ...] = ()
    #: Calls refused as not this grant's (another model, a body over the cap).
    refused: tuple[str, ...] = ()


class RunSpend(BaseModel):
    """The run's spend in all, and whether its budget is reached (and why)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    counts: Counts = Counts()
    budget_reached: str | None = None
    grants: int = Field(default=0, ge=0)
