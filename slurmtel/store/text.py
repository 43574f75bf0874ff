"""Text PostgreSQL always accepts, for the records that must never fail to be written.

A quarantined record or a run's message carries whatever the input held: NUL bytes (PostgreSQL
text cannot hold them), unpaired surrogates (a JSON `\\ud800` escape, or a byte that was not
UTF-8 kept by `surrogateescape`; neither can be encoded), megabytes of a damaged line.
`storable_text` writes the first two as visible escapes and bounds the length, so the insert
of a quarantine row or a run record cannot fail because of its text.
"""

from __future__ import annotations

import re

# what one quarantined raw text (or a run's message) keeps at most, in characters
MAX_STORED_CHARS = 65536
# NUL, and UTF-16 surrogates that are not part of a pair (Python str holds them only unpaired)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte surrogateescape kept: the byte itself
    if code == 0:
        return "\\x00"
    return f"\\u{code:04x}"


def storable_text(value: object, limit: int = MAX_STORED_CHARS) -> str:
    """VALUE as text PostgreSQL stores: NUL and unpaired surrogates written as escapes ("\\x00",
    "\\xff" for a byte kept by surrogateescape, "\\ud800"), and at most LIMIT characters plus a
    note of how many were left out. Anything that is not a str is written as its repr()."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "surrogateescape")
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = repr(value)
        except RecursionError:
            text = f"<{type(value).__name__} nested too deeply to show>"
    cut = 0
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    if _UNSTORABLE.search(text):
        text = _UNSTORABLE.sub(_escape, text)
        if len(text) > limit:
            cut += len(text) - limit
            text = text[:limit]
    if cut:
        text += f"... [{cut} more characters]"
    return text


__all__ = ["MAX_STORED_CHARS", "storable_text"]
