"""`--harbor-dataset` references, made into folders once, by the controller: xdist workers
are given the controller's resolution and never fetch or resolve a branch themselves."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_harbor.datasets import ReferenceError, ResolvedDataset
from pytest_harbor.plugin.options import HarborOptions

__all__ = ["WORKER_DATASETS", "resolve_references"]

#: The workerinput key of the controller's resolutions.
WORKER_DATASETS = "harbor_datasets"


def resolve_references(
    options: HarborOptions, worker_input: dict[str, Any] | None, warnings: list[str]
) -> list[ResolvedDataset]:
    """Every reference of the run, resolved (warnings, such as a cache entry fetched again,
    go to `warnings`); a reference that cannot be resolved at all is a usage error."""
    if worker_input is not None:
        return [
            ResolvedDataset.model_validate(data) for data in worker_input.get(WORKER_DATASETS) or []
        ]
    pinned = {recorded.given: recorded for recorded in options.pinned_datasets}
    if not options.references:
        return []
    from pytest_harbor.datasets.git import GitError
    from pytest_harbor.datasets.registry import RegistryError
    from pytest_harbor.datasets.resolve import DatasetCache

    cache = DatasetCache(options.cache_dir, warnings.append)
    resolved = []
    for given in options.references:
        try:
            if given in pinned:
                resolved.append(cache.pinned(pinned[given]))
            else:
                resolved.append(cache.resolve(given, options.registry))
        except (ReferenceError, RegistryError, GitError) as error:
            raise pytest.UsageError(f"--harbor-dataset {given}: {error}") from None
    return resolved
