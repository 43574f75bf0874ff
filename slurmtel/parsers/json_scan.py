"""Reading a JSON document of records one record at a time, whatever shape it is in.

Slurm's JSON outputs are one object with a list of records (`{"meta": ..., "jobs": [...]}`).
A document that cannot be decoded whole (cut short, a damaged record, a record nested 1000
deep, a number no decoder takes) is read here value by value: each element of the list is
decoded on its own (Python's C scanner) and handed on at once, so memory is bounded by the
largest record; an element that cannot be decoded is skipped by its brackets and quotes alone
(which costs no recursion) and handed on as a BadItem. A document that ends inside a value
raises Truncated with where the last complete element ended.

Pure functions of their input; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_PARTIAL_TOKEN = re.compile(
    r"-?\d*(?:\.\d*)?(?:[eE][+-]?\d*)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?"
)
# what a container's end is found by: quotes (strings are skipped) and brackets
_STRUCTURE = re.compile(r'["{}\[\]]')
_STRING_STOP = re.compile(r'["\\]')
_SCALAR = re.compile(r"[^,\]}\s]*")
_KINDS = {"[": "list", '"': "str", "t": "bool", "f": "bool", "n": "NoneType"}


class Truncated(Exception):
    """The text ends inside a value; POS is where the value (or the element) began."""

    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


class NotAnObject(Exception):
    """The document is a JSON value other than an object; str(exc) names its kind."""


@dataclass(frozen=True, slots=True)
class BadItem:
    """An element of the list that cannot be decoded: why, and its text."""

    reason: str
    text: str


def loads_one(text: str | bytes) -> Any:
    """One record's JSON text -> objects, by Python's json (integers of any size, 1e999);
    BadItem-worthy failures raise ValueError naming the reason."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None


def scan_object(
    text: str,
    list_key: str,
    on_item: Callable[[int, Any, str], None],
    on_value: Callable[[str, Any], None],
) -> bool:
    """Read the top-level object of TEXT: each element of its LIST_KEY list goes to
    on_item(index, value or BadItem, its text), every other top-level value to
    on_value(key, value or BadItem: one nested too deeply to decode). Returns whether the
    object had a LIST_KEY list.

    Raises Truncated when the text ends inside a value (pos: the end of the last complete
    element, or the start of the unfinished top-level value), NotAnObject, and ValueError
    when the text is not a JSON object for another reason (damage outside the list).
    """
    decoder = json.JSONDecoder()
    end = len(text)
    pos = _skip(text, 0)
    if pos >= end:
        raise Truncated(pos)
    if text[pos] != "{":
        raise NotAnObject(_KINDS.get(text[pos], "int or float"))
    pos += 1
    found = False
    while True:
        pos = _skip(text, pos)
        if pos >= end:
            raise Truncated(pos)
        char = text[pos]
        if char == "}":
            if _skip(text, pos + 1) != end:
                raise ValueError(f"extra data after the document at char {pos + 1}")
            return found
        if char == ",":
            pos += 1
            continue
        item_start = pos
        key, pos = _decode(decoder, text, pos, item_start)
        pos = _skip(text, pos)
        if pos >= end:
            raise Truncated(item_start)
        if text[pos] != ":":
            raise ValueError(f"expected ':' at char {pos}")
        pos = _skip(text, pos + 1)
        if pos >= end:
            raise Truncated(item_start)
        if key == list_key and text[pos] == "[":
            found = True
            pos = _scan_list(text, decoder, pos + 1, on_item)
            continue
        value: Any
        try:
            value, pos = _decode(decoder, text, pos, item_start)
        except RecursionError:
            # a top-level value nested past what can be decoded: skipped by its brackets and
            # handed on as such (the caller names it), the rest of the document read on
            value_start = pos
            pos = value_end(text, value_start)
            value = BadItem("nested too deeply to read", text[value_start:pos])
        on_value(key, value)


def read_document(text: str, list_key: str) -> dict[str, Any]:
    """TEXT's top-level object as a dict whose LIST_KEY list holds its elements, those that
    cannot be decoded as BadItem (for documents small enough to hold whole: a controller view,
    an agent page). Raises like scan_object."""
    document: dict[str, Any] = {}
    items: list[Any] = []

    def on_item(index: int, item: Any, item_text: str) -> None:
        items.append(item)

    def on_value(key: str, value: Any) -> None:
        document[key] = value

    if scan_object(text, list_key, on_item, on_value):
        document[list_key] = items
    return document


def _scan_list(
    text: str, decoder: json.JSONDecoder, pos: int, on_item: Callable[[int, Any, str], None]
) -> int:
    end = len(text)
    after_last = pos
    index = 0
    try:
        while True:
            pos = _skip(text, pos)
            if pos >= end:
                raise Truncated(pos)
            char = text[pos]
            if char == "]":
                return pos + 1
            if char == ",":
                pos += 1
                continue
            start = pos
            item: Any
            try:
                item, pos = _decode(decoder, text, pos, pos)
            except (ValueError, RecursionError) as exc:
                # not a cut: this one element is damaged (or nested past what can be decoded);
                # find its end by its brackets and hand it on as such
                pos = value_end(text, start)
                reason = (
                    "nested too deeply to read"
                    if isinstance(exc, RecursionError)
                    else f"not valid JSON: {exc}"
                )
                item = BadItem(reason, text[start:pos])
            on_item(index, item, text[start:pos])
            index += 1
            after_last = pos
    except Truncated:
        raise Truncated(after_last) from None


def value_end(text: str, pos: int) -> int:
    """Where the JSON value starting at POS ends, by its brackets and quotes alone (so its
    nesting depth costs nothing); Truncated when the text ends first."""
    char = text[pos]
    if char == '"':
        return _string_end(text, pos + 1)
    if char not in "{[":
        m = _SCALAR.match(text, pos)
        stop = m.end() if m else pos
        if stop >= len(text):
            raise Truncated(pos)
        return max(stop, pos + 1)
    depth = 0
    at = pos
    while True:
        m = _STRUCTURE.search(text, at)
        if m is None:
            raise Truncated(pos)
        found = m.start()
        char = text[found]
        if char == '"':
            at = _string_end(text, found + 1)
            continue
        depth += 1 if char in "{[" else -1
        at = found + 1
        if depth == 0:
            return at


def _string_end(text: str, at: int) -> int:
    while True:
        m = _STRING_STOP.search(text, at)
        if m is None:
            raise Truncated(at)
        if text[m.start()] == "\\":
            at = m.start() + 2
            if at > len(text):
                raise Truncated(at)
            continue
        return m.end()


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def _decode(decoder: json.JSONDecoder, text: str, pos: int, restart: int) -> tuple[Any, int]:
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        if _ends_inside(text, exc):
            raise Truncated(restart) from None
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None


def _ends_inside(text: str, exc: json.JSONDecodeError) -> bool:
    """Whether a decode error means "the text stopped" rather than "the text is wrong"."""
    if exc.pos >= len(text) or exc.msg.startswith("Unterminated string"):
        return True
    if exc.msg.startswith("Invalid \\uXXXX escape") or exc.msg.startswith("Invalid \\escape"):
        return exc.pos >= len(text) - 6
    # a number or literal cut in the middle: "tru", "-", "12."
    return _PARTIAL_TOKEN.fullmatch(text, exc.pos) is not None


def byte_offset(text: str, pos: int, chunk: int = 1 << 20) -> int:
    """The byte offset in the UTF-8 input of character POS of TEXT (counted a chunk at a
    time: no copy of a 150 MB prefix)."""
    if text.isascii():
        return pos
    return sum(len(text[at : min(at + chunk, pos)].encode("utf-8", "replace")) for at in range(0, pos, chunk))


__all__ = [
    "BadItem",
    "NotAnObject",
    "Truncated",
    "byte_offset",
    "loads_one",
    "read_document",
    "scan_object",
    "value_end",
]
