"""The bounds every value a caller gives must keep, the same for the CLI and the read API.

A value past them is refused with one line that names it (ConfigError: a usage error on the
CLI, 400 on the API) before any work is done: a NUL or a control character in a name (PostgreSQL
text cannot hold a NUL; a terminal or a log would obey an escape), a name or a list longer than
any Slurm has, a count beyond what SQL takes (LIMIT is a bigint), a number that is not finite.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable

from slurmtel.errors import ConfigError

# a count handed to SQL (LIMIT, top N): well inside what PostgreSQL's bigint holds
MAX_COUNT = 1_000_000_000
# a user, account, partition, cluster or QOS name (Slurm keeps them far shorter)
MAX_NAME_CHARS = 256
# names in one filter (-A a,b,c)
MAX_NAMES = 1000
# a float option (target GPU-hours, a rate): finite and at most this
MAX_NUMBER = 1e15
# what an error message shows of a refused value
SHOWN_CHARS = 40


def shown(value: object) -> str:
    """VALUE as an error message shows it: quoted, control characters escaped, at most
    SHOWN_CHARS characters of it."""
    text = value if isinstance(value, str) else str(value)
    cut = text[:SHOWN_CHARS].encode("unicode_escape", "backslashreplace").decode("ascii")
    return repr(cut) if len(text) <= SHOWN_CHARS else f"{cut!r}... ({len(text)} characters)"


def _bad_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cs") or char in "\u2028\u2029":
            return char
    return None


def check_name(value: str, what: str) -> str:
    """VALUE when it can be a name: at most MAX_NAME_CHARS, no control character (NUL, escape,
    line break), no unpaired surrogate. ConfigError naming WHAT otherwise."""
    if len(value) > MAX_NAME_CHARS:
        raise ConfigError(f"{what}: a name of at most {MAX_NAME_CHARS} characters, not {shown(value)}")
    char = _bad_character(value)
    if char is not None:
        raise ConfigError(
            f"{what}: {shown(value)} holds a control character ({char.encode('unicode_escape').decode()})"
        )
    return value


def check_names(values: Iterable[str], what: str) -> tuple[str, ...]:
    names = tuple(values)
    if len(names) > MAX_NAMES:
        raise ConfigError(f"{what}: at most {MAX_NAMES} names, not {len(names)}")
    for name in names:
        check_name(name, what)
    return names


def check_count(number: int, what: str, minimum: int = 1) -> int:
    """NUMBER when MINIMUM <= NUMBER <= MAX_COUNT; ConfigError naming WHAT otherwise."""
    if not minimum <= number <= MAX_COUNT:
        raise ConfigError(f"{what} must be between {minimum} and {MAX_COUNT}, not {shown(number)}")
    return number


def parse_count(text: str, what: str, minimum: int = 1) -> int:
    """TEXT as a whole number MINIMUM .. MAX_COUNT; ConfigError naming WHAT otherwise."""
    stripped = text.strip()
    if not stripped.lstrip("+-").isdigit() or len(stripped) > 20:
        raise ConfigError(f"{what} must be a whole number, not {shown(text)}")
    return check_count(int(stripped), what, minimum)


def check_number(number: float, what: str) -> float:
    """NUMBER when finite and |NUMBER| <= MAX_NUMBER; ConfigError naming WHAT otherwise."""
    if not math.isfinite(number) or abs(number) > MAX_NUMBER:
        raise ConfigError(f"{what} must be a finite number of at most {MAX_NUMBER:g}, not {shown(number)}")
    return number


__all__ = [
    "MAX_COUNT",
    "MAX_NAMES",
    "MAX_NAME_CHARS",
    "check_count",
    "check_name",
    "check_names",
    "check_number",
    "parse_count",
    "shown",
]
