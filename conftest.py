"""pytest-harbor's own tests keep their fixtures in tests/conftest.py, which loads only with
them: a run of a dataset that lies in this checkout does not load them."""
