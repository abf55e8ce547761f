"""Fixtures shared by pytest-harbor's own tests (tests/fixtures.py), and pytester."""

pytest_plugins = ["pytester", "tests.fixtures"]
