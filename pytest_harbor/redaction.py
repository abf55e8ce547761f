"""Secret values (settings `secrets`, the model's API key) replaced by `***` wherever a run
writes or prints (text, and the names of the files it writes), and cuts of text that leave
no recognisable part of one behind."""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

from pytest_harbor.display import escape_controls
from pytest_harbor.settings import HarborSettings

__all__ = ["CUT", "FRAGMENT_MIN", "MASK", "Redactor", "clip_head", "clip_tail", "run_redactor"]

MASK = "***"
#: What a cut of text leaves where the text was cut (clip_head, clip_tail).
CUT = "[...]"
#: The marks of a cut, ours and those of capped output and cut files ("[... 12 bytes cut
#: ...]", "[... cut: 12 more bytes ...]"): a secret split by a cut is looked for beside them.
_CUT_MARKS = re.compile(r"\[\.\.\.[^\]\n]{0,80}\]")
_CUT_MARKS_BYTES = re.compile(_CUT_MARKS.pattern.encode())
#: A piece of a secret this long or longer, left at a cut or at either end of a text, is
#: masked. Shorter pieces are left: masking them would mask innocent words as often.
FRAGMENT_MIN = 8

_S = TypeVar("_S", str, bytes)


def clip_head(text: str, limit: int) -> str:
    """The first `limit` characters of `text`, the cut marked."""
    return text if len(text) <= limit else text[:limit] + CUT


def clip_tail(text: str, limit: int) -> str:
    """The last `limit` characters of `text`, the cut marked."""
    return text if len(text) <= limit else CUT + text[-limit:]


class Redactor:
    """Replaces every secret value, as written and as JSON would escape it, by `***`.

    Text may have been cut anywhere before it gets here: so a piece of a secret at the
    start or the end of a text, or beside a cut mark, is masked too when it is
    FRAGMENT_MIN characters or longer (the beginning of a secret before a cut, its end
    after one)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values = tuple(value for value in secrets if value)
        forms = set()
        for value in self._values:
            forms.add(value)
            forms.add(json.dumps(value)[1:-1])
        # Longest first, so a secret that contains another is masked whole.
        self._texts = sorted(forms, key=len, reverse=True)
        self._bytes = [form.encode() for form in self._texts]

    def __bool__(self) -> bool:
        return bool(self._texts)

    def adding(self, secrets: Iterable[str]) -> Redactor:
        """This redactor with `secrets` masked too (itself when there are none)."""
        more = [value for value in secrets if value and value not in self._values]
        return Redactor([*self._values, *more]) if more else self

    def text(self, value: str) -> str:
        if not self._texts:
            return value
        value = _whole(value, self._texts, MASK)
        return _at_cuts(value, self._texts, MASK, _CUT_MARKS, start=True, end=True)

    def shown(self, value: str) -> str:
        """Text from a sandbox as a person is shown it (the terminal, the junit XML):
        secrets masked and control characters escaped (display.escape_controls). Masked
        before and after: a secret that holds a control character is found as written,
        and no escape makes up one."""
        return self.text(escape_controls(self.text(value)))

    def name(self, value: str) -> str:
        """One name of a path a run writes (a file or a folder), masked as text is: a
        secret whole, and a piece of one at either end (a `/` in a secret cuts it into
        names, as a cut of text would)."""
        return self.text(value)

    def bytes(self, data: builtins.bytes) -> builtins.bytes:
        if not self._bytes:
            return data
        mask = MASK.encode()
        data = _whole(data, self._bytes, mask)
        return _at_cuts(data, self._bytes, mask, _CUT_MARKS_BYTES, start=True, end=True)

    def data(self, value: Any) -> Any:
        """JSON-like data with every string (keys too) masked; numbers stay numbers, so a
        short secret cannot break the document."""
        if not self._texts:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(key)): self.data(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(item) for item in value]
        return value

    def stream(
        self, chunks: Iterable[builtins.bytes], *, cut: bool = False
    ) -> Iterator[builtins.bytes]:
        """Chunks of bytes masked as they pass, a secret split across two chunks too (the
        last bytes of each are held back until the next one comes). With `cut`, the
        stream is the head of something longer: a beginning of a secret at its end is
        masked as well."""
        if not self._bytes:
            yield from chunks
            return
        mask = MASK.encode()
        held_back = max(len(secret) for secret in self._bytes) - 1
        pending = b""
        first = True
        for chunk in chunks:
            masked = _whole(pending + chunk, self._bytes, mask)
            cut_at = len(masked) - held_back
            if cut_at > 0:
                out = masked[:cut_at]
                if first:
                    out = _at_cuts(out, self._bytes, mask, _CUT_MARKS_BYTES, start=True, end=False)
                    first = False
                yield out
                pending = masked[cut_at:]
            else:
                pending = masked
        if pending:
            yield _at_cuts(pending, self._bytes, mask, _CUT_MARKS_BYTES, start=first, end=cut)


class _HoldsSecrets(Protocol):
    def secret_values(self) -> list[str]: ...


def run_redactor(settings: HarborSettings, model: _HoldsSecrets | None) -> Redactor:
    """The redactor of a run (or of an episode run on its own): the settings' `secrets`
    and the model's API key."""
    secrets = settings.revealed_secrets().values()
    return Redactor([*secrets, *(model.secret_values() if model else [])])


def _whole(value: _S, secrets: list[_S], mask: _S) -> _S:
    for secret in secrets:
        value = value.replace(secret, mask)
    return value


def _at_cuts(
    value: _S,
    secrets: list[_S],
    mask: _S,
    marks: re.Pattern[_S],
    *,
    start: bool,
    end: bool,
) -> _S:
    """`value` with the pieces of secrets masked that a cut may have left: an end of a
    secret right after the start (or a cut mark), a beginning of one right before the end
    (or a cut mark). A line break between the mark and the piece is allowed."""
    newline = "\n" if isinstance(value, str) else b"\n"
    pieces: list[_S] = []
    found: list[re.Match[_S]] = list(marks.finditer(value))
    # Segments between marks: each one's start follows a cut (or is the text's start),
    # each one's end precedes one (or is the text's end).
    bounds = [(0, start)] + [(match.end(), True) for match in found]
    ends = [(match.start(), True) for match in found] + [(len(value), end)]
    for (begin, after_cut), (stop, before_cut), match in zip(
        bounds, ends, [*found, None], strict=True
    ):
        segment = value[begin:stop]
        if after_cut:
            segment = _mask_leading(segment, secrets, mask, newline)
        if before_cut:
            segment = _mask_trailing(segment, secrets, mask, newline)
        pieces.append(segment)
        if match is not None:
            pieces.append(value[match.start() : match.end()])
    return value[:0].join(pieces)


def _mask_leading(segment: _S, secrets: list[_S], mask: _S, newline: _S) -> _S:
    skip = len(newline) if segment.startswith(newline) else 0
    body = segment[skip:]
    for secret in secrets:
        for length in range(len(secret) - 1, FRAGMENT_MIN - 1, -1):
            if body.startswith(secret[len(secret) - length :]):
                return segment[:skip] + mask + body[length:]
    return segment


def _mask_trailing(segment: _S, secrets: list[_S], mask: _S, newline: _S) -> _S:
    skip = len(newline) if segment.endswith(newline) else 0
    body = segment[: len(segment) - skip]
    for secret in secrets:
        for length in range(len(secret) - 1, FRAGMENT_MIN - 1, -1):
            if body.endswith(secret[:length]):
                return body[: len(body) - length] + mask + segment[len(body) :]
    return segment
