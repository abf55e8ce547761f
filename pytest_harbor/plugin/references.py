"""`--harbor-dataset` references, made into folders once, by the controller: xdist workers
are given the controller's resolution and never fetch or resolve a branch themselves."""

from __future__ import annotations

import pytest

from pytest_harbor.datasets import ReferenceError, ResolvedDataset
from pytest_harbor.plugin.options import HarborOptions
from pytest_harbor.plugin.worker_start import WorkerStart

__all__ = ["resolve_references"]


def resolve_references(
    options: HarborOptions, handed: WorkerStart | None, warnings: list[str]
) -> list[ResolvedDataset]:
    """Every reference of the run, resolved (warnings, such as a cache entry fetched again,
    go to `warnings`); a reference that cannot be resolved at all is a usage error. An
    xdist worker takes the controller's resolutions from what it was `handed`."""
    if handed is not None:
        return list(handed.datasets)
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
