"""Secret values masked in text, bytes and JSON data."""

from __future__ import annotations

import json

from pytest_harbor.redaction import Redactor


def test_text_and_bytes_are_masked_longest_first() -> None:
    redactor = Redactor(["abc", "abcdef", ""])
    assert redactor.text("x abcdef y abc") == "x *** y ***"
    assert redactor.bytes(b"abcdef") == b"***"
    assert not Redactor([""])


def test_the_json_escaped_form_is_masked_too() -> None:
    secret = 'pa"ss\\word'
    line = json.dumps({"reason": f"key {secret}"})
    assert secret not in Redactor([secret]).text(line).replace("***", "")
    assert json.dumps(secret)[1:-1] not in Redactor([secret]).text(line)


def test_data_keeps_numbers_so_a_short_secret_cannot_break_a_row() -> None:
    masked = Redactor(["1"]).data({"reward": 1.0, "note": "got 1", "list": ["1", 1], "1": 2})
    assert masked == {"reward": 1.0, "note": "got ***", "list": ["***", 1], "***": 2}
    assert json.loads(json.dumps(masked)) == masked


def test_a_stream_is_masked_across_chunk_boundaries() -> None:
    redactor = Redactor(["topsecret"])
    text = b"a topsecret b " * 50
    for size in (1, 2, 5, 9, 64):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        assert b"".join(redactor.stream(chunks)) == text.replace(b"topsecret", b"***")
    assert list(Redactor().stream([b"x", b"y"])) == [b"x", b"y"]
