"""Secret values (settings `secrets`, the model's API key) replaced by `***` wherever a run
writes or prints."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["MASK", "Redactor"]

MASK = "***"


class Redactor:
    """Replaces every secret value, as written and as JSON would escape it, by `***`."""

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

    def text(self, value: str) -> str:
        for secret in self._texts:
            value = value.replace(secret, MASK)
        return value

    def bytes(self, data: bytes) -> bytes:
        for secret in self._bytes:
            data = data.replace(secret, MASK.encode())
        return data

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

    def stream(self, chunks: Iterable[builtins.bytes]) -> Iterator[builtins.bytes]:
        """Chunks of bytes masked as they pass, a secret split across two chunks too (the
        last bytes of each are held back until the next one comes)."""
        if not self._bytes:
            yield from chunks
            return
        held_back = max(len(secret) for secret in self._bytes) - 1
        pending = b""
        for chunk in chunks:
            masked = self.bytes(pending + chunk)
            cut = len(masked) - held_back
            if cut > 0:
                yield masked[:cut]
                pending = masked[cut:]
            else:
                pending = masked
        if pending:
            yield pending

    def extended(self, secrets: Iterable[str]) -> Redactor:
        """This redactor with more values to hide."""
        return Redactor([*self._values, *secrets])
