"""What a hostile sandbox writes, as hypothesis strategies: random bytes, JSON nested far
deeper than any reader recurses, numbers no float holds, and odd Unicode."""

from __future__ import annotations

import json

from hypothesis import strategies as st

#: Deeper than Python's stack allows a recursive reader (its limit is 1,000 frames).
DEEP = 3_000

#: Numbers as text that overflow a float or Python's integer-string limit (4,300 digits).
HUGE_NUMBERS = (
    "1e400",
    "-1e400",
    "1" * 400,
    "9" * 4_300,
    "1" * 5_000,
    "-" + "9" * 5_000,
    "1e308",
    "2e-400",
)

#: Characters that trip decoders and displays: escaped lone surrogates, a BOM, NUL, the
#: bidi override, a line separator, an escape sequence, U+FFFF.
ODD_TEXT = (
    "\\ud800",
    "\\udfff",
    "\\ud83d",
    "\ufeff",
    "\\u0000",
    "\u202e",
    "\u2028",
    "\x1b]0;",
    "\uffff",
)


def deep(depth: int = DEEP, opener: str = "[", closer: str = "]", inner: str = "1") -> str:
    return opener * depth + inner + closer * depth


DEEP_TEXTS = (
    deep(),
    deep(opener='{"a":', closer="}"),
    '{"reward": 1, "x": ' + deep() + "}",
    '{"steps": [' + deep(opener='{"message":', closer="}", inner='"hi"') + "]}",
    deep(opener="[", closer=""),  # never closed
    '"' + "[" * DEEP + '"',  # brackets inside a string are not nesting
)


@st.composite
def nested_json(draw: st.DrawFn) -> str:
    """JSON text nested 1 to DEEP levels, mixing arrays and objects, closed or not."""
    depth = draw(st.integers(1, DEEP))
    kinds = draw(st.lists(st.sampled_from(["[", '{"k":']), min_size=1, max_size=4))
    openers = [kinds[index % len(kinds)] for index in range(depth)]
    inner = draw(st.sampled_from(["1", '"s"', "null", "1e400", "NaN", "[]", "{}"]))
    closers = "".join("]" if opener == "[" else "}" for opener in reversed(openers))
    closed = draw(st.booleans())
    return "".join(openers) + inner + (closers if closed else closers[: len(closers) // 2])


def _json_leaves() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HUGE_NUMBERS),
        st.sampled_from(["NaN", "Infinity", "-Infinity", "true", "null", "0", "-0.0"]),
        st.sampled_from(ODD_TEXT).map(lambda text: json.dumps(text).replace("\\\\u", "\\u")),
        st.text().map(json.dumps),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
    )


def json_texts() -> st.SearchStrategy[str]:
    """JSON-like text: valid documents with hostile leaves, and broken or deep ones."""
    documents = st.recursive(
        _json_leaves(),
        lambda children: st.one_of(
            st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
            st.dictionaries(
                st.one_of(st.text(max_size=8), st.sampled_from(ODD_TEXT)), children, max_size=4
            ).map(
                lambda items: (
                    "{"
                    + ", ".join(f"{json.dumps(key)}: {value}" for key, value in items.items())
                    + "}"
                )
            ),
        ),
        max_leaves=12,
    )
    return st.one_of(
        documents,
        nested_json(),
        st.sampled_from(DEEP_TEXTS),
        st.text(max_size=200),
        documents.map(lambda text: "\ufeff" + text),
    )


def payloads() -> st.SearchStrategy[bytes]:
    """Anything a sandbox can write into a file: random bytes, JSON-like text encoded
    as UTF-8 (with a BOM sometimes), or that text cut or with bytes that are not UTF-8."""
    text = json_texts()
    return st.one_of(
        st.binary(max_size=300),
        text.map(lambda value: value.encode("utf-8", "surrogatepass")),
        text.map(lambda value: b"\xef\xbb\xbf" + value.encode("utf-8", "surrogatepass")),
        st.tuples(text, st.binary(min_size=1, max_size=8)).map(
            lambda pair: pair[0].encode("utf-8", "surrogatepass")[: len(pair[0]) // 2] + pair[1]
        ),
    )
