"""The one `${NAME}` grammar: whole values in env tables, templates inside MCP headers."""

from __future__ import annotations

import pytest

from pytest_harbor.templates import (
    SecretReference,
    Template,
    TemplateSources,
    fill,
    fill_inside,
    names_inside,
    whole_template,
)


@pytest.mark.parametrize(
    ("value", "template"),
    [
        ("${TOKEN}", Template("TOKEN")),
        ("${_A1}", Template("_A1")),
        ("${TOKEN:-}", Template("TOKEN", "")),
        ("${TOKEN:-a default}", Template("TOKEN", "a default")),
        # The default runs to the last brace, newlines and braces included.
        ("${A:-x}${B}", Template("A", "x}${B")),
        ("${A:-line\nnext}", Template("A", "line\nnext")),
        # Only a whole value is a template: anything around it, or a bad name, is text.
        ("Bearer ${TOKEN}", None),
        ("${TOKEN} ", None),
        ("${A}${B}", None),
        ("${1A}", None),
        ("$TOKEN", None),
        ("${TOKEN-x}", None),
        ("plain", None),
    ],
)
def test_a_whole_value_is_a_template_or_text(value: str, template: Template | None) -> None:
    assert whole_template(value) == template


def test_a_whole_value_is_filled_from_the_first_source_that_has_it() -> None:
    first, second = {"A": "one"}, {"A": "two", "B": "bee"}
    assert fill("${A}", first, second) == "one"
    assert fill("${B:-unused}", first, second) == "bee"
    assert fill("${A}", {"A": ""}, second) == ""
    assert fill("${C:-fallback}", first, second) == "fallback"
    assert fill("${C}", first, second) is None
    assert fill("Bearer ${A}", first) == "Bearer ${A}"


def test_templates_inside_a_header_are_filled_without_defaults() -> None:
    sources = ({"TOKEN": "t0k"}, {"TOKEN": "host", "USER": "me"})
    assert names_inside("Bearer ${TOKEN} for ${USER}") == ["TOKEN", "USER"]
    assert fill_inside("Bearer ${TOKEN} for ${USER}", *sources) == "Bearer t0k for me"
    # A name set nowhere is left empty; a default is no template inside a header.
    assert fill_inside("x${MISSING}y", *sources) == "xy"
    assert names_inside("${TOKEN:-x}") == []
    assert fill_inside("${TOKEN:-x}", *sources) == "${TOKEN:-x}"


def test_a_reference_is_filled_from_the_secrets_before_the_host() -> None:
    secrets, host = {"API_TOKEN": "s3cret"}, {"API_TOKEN": "host", "CARRIER": "Bearer s3cret"}
    assert SecretReference("API_TOKEN", ("API_TOKEN",)).fill(secrets, host) == "s3cret"
    assert SecretReference("CARRIER", ("API_TOKEN",)).fill(secrets, host) == "Bearer s3cret"
    with pytest.raises(KeyError, match="OTHER"):
        SecretReference("OTHER", ("OTHER",)).fill(secrets, host)


def test_a_secret_is_a_reference_in_a_verifier_table_and_a_carrier_in_any() -> None:
    sources = TemplateSources(
        host={"PLAIN": "x"}, secrets=frozenset({"API_TOKEN"}), carriers={"CARRIER": ("API_TOKEN",)}
    )
    assert sources.reference("API_TOKEN", verifier=True) == SecretReference(
        "API_TOKEN", ("API_TOKEN",)
    )
    # A table the agent's sandbox gets does not read secrets, only host variables.
    assert sources.reference("API_TOKEN", verifier=False) is None
    for verifier in (True, False):
        assert sources.reference("CARRIER", verifier=verifier) == SecretReference(
            "CARRIER", ("API_TOKEN",)
        )
        assert sources.reference("PLAIN", verifier=verifier) is None
