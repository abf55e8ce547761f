"""Result writers: the files a run leaves in its results folder."""

from pytest_harbor.writers.rollouts import ResultsLayout, RolloutsWriter

__all__ = ["ResultsLayout", "RolloutsWriter"]
