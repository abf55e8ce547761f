"""Fixtures shared by pytest-harbor's own tests."""

pytest_plugins = ["pytester", "tests.fixtures"]
