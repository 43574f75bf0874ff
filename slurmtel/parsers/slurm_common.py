"""Helpers shared by the Slurm parsers: Slurm's number objects, TRES, job states, node lists.

Pure functions of their arguments; no I/O. (`gc_paused`, which bulk work in the parsers, the
agent and the store shares, lives in slurmtel.gcpause.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import hostlist

# Slurm's "no value" and "infinite" sentinels (slurm.h NO_VAL16/INFINITE16, NO_VAL/INFINITE,
# NO_VAL64/INFINITE64). Every JSON schema prints them in plain-int fields (time.start of a job
# that never started is 4294967294 in 23.x-24.x), the newer ones also wrap numbers in
# {"set", "infinite", "number"}; the text outputs print them as they are.
NO_VAL16, INFINITE16 = 0xFFFE, 0xFFFF
NO_VAL32, INFINITE32 = 0xFFFFFFFE, 0xFFFFFFFF
NO_VAL64, INFINITE64 = 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF
# the sentinels of a field of each width: its own and the wider ones (no real value of the
# field is that large), and in 64-bit fields the 32-bit ones too, which Slurm copies into them
# (times, TRES counts); never a 16-bit one in a wider field (65534 is a real uid: nobody)
_WIDE = frozenset({NO_VAL32, INFINITE32, NO_VAL64, INFINITE64})
SENTINELS: dict[int, frozenset[int]] = {16: _WIDE | {NO_VAL16, INFINITE16}, 32: _WIDE, 64: _WIDE}
# any width: what no time field can mean
_ANY_SENTINEL = SENTINELS[16] | SENTINELS[64]
# the text outputs' words for "no time"
NO_TIME_WORDS = frozenset({"", "unknown", "none", "n/a", "(null)", "0", "none assigned"})

# the state flags sacct prints instead of the base state, in the order slurm's
# job_state_string() tests them (src/common/slurm_protocol_defs.c)
SACCT_STATE_FLAGS = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# what sacct prints in NodeList (and JSON in "nodes") when a job has no nodes
NO_NODES = frozenset({"", "None assigned", "(null)", "None"})

GPU_KEY = "gres/gpu"
_GPU_TYPED_PREFIX = "gres/gpu:"
# TRES counted in megabytes (sacct JSON's unit); a suffixed value is converted to these
_MEGABYTE_TRES = frozenset({"mem", "vmem"})
_SUFFIX_POWER = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_TRES_VALUE = re.compile(r"(\d+(?:\.\d+)?)([KMGTPE]?)", re.IGNORECASE)
_DURATION = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?")


def unwrap_number(value: Any, bits: int = 32) -> int | None:
    """Slurm's `{"set", "infinite", "number"}` object (or a plain number) -> int; None when it is
    not set: unset, infinite, Slurm's NO_VAL/INFINITE of a BITS-wide field (16, 32 or 64), or
    not a number at all (a string, true/false)."""
    if type(value) is int:
        return None if value >= NO_VAL16 and value in SENTINELS[bits] else value
    if value is None:
        return None
    if type(value) is dict:
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
        if type(value) is int:
            return None if value >= NO_VAL16 and value in SENTINELS[bits] else value
    if type(value) is float and math.isfinite(value):
        return unwrap_number(int(value), bits)
    return None


def slurm_epoch(value: Any) -> int | None:
    """A Slurm time field (epoch seconds, plain or wrapped) -> seconds; None when not set: 0,
    negative, any NO_VAL/INFINITE, {"set": false}, or not a number."""
    if type(value) is not int:
        value = unwrap_number(value, 64)
        if value is None:
            return None
    if value <= 0 or value in _ANY_SENTINEL:
        return None
    return value


def text_number(text: str | None, bits: int = 32) -> int | None:
    """A number as the text outputs print it ("4", " 17 ") -> int; None when it is no plain
    decimal count or one of Slurm's sentinels of a BITS-wide field ("4294967294")."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    return unwrap_number(int(text), bits)


# Slurm JSON schema versions (0.0.N) whose shape slurmtel knows: 21.08 (v0.0.37) to 25.11 (v0.0.44)
SUPPORTED_SCHEMA_VERSIONS = range(37, 45)
# the schema as a document's meta names it: meta.plugin.type "openapi/v0.0.38" or
# "openapi/dbv0.0.38" (21.08, 22.05), meta.plugins.data_parser (23.02) or
# meta.plugin.data_parser (23.11+, with type "" or "openapi/slurmdbd") "data_parser/v0.0.42"
_SCHEMA_LABEL = re.compile(r"(?:openapi/v|openapi/dbv|data_parser/v)0\.0\.(\d+)")
# plugin names that name no schema version
_NO_VERSION = frozenset({"", "openapi/slurmctld", "openapi/slurmdbd"})


def unknown_schema(meta: Any) -> str | None:
    """The schema a Slurm JSON document's META names (cut to 100 characters) when slurmtel does
    not know it (a newer Slurm: 26.05 prints data_parser/v0.0.45, or a name never seen); None
    for a known one, or when META names none (the objects are then read by shape)."""
    if not isinstance(meta, dict):
        return None
    plugin = meta.get("plugin")
    plugin = plugin if isinstance(plugin, dict) else {}
    plugins = meta.get("plugins")
    plugins = plugins if isinstance(plugins, dict) else {}
    for label in (plugin.get("data_parser"), plugins.get("data_parser"), plugin.get("type")):
        if not isinstance(label, str) or label in _NO_VERSION:
            continue
        m = _SCHEMA_LABEL.fullmatch(label)
        if m is not None and int(m.group(1)) in SUPPORTED_SCHEMA_VERSIONS:
            return None
        return label[:100]
    return None


# errors Slurm prints beside a (possibly empty) list of records that only say nothing was found
# (ESLURM_REST_EMPTY_RESULT "Nothing found": sacct --json of 22.05 for a window without jobs)
INFORMATIONAL_ERRORS = frozenset({9003})


def only_informational(errors: Any) -> bool:
    """Whether every entry of a JSON document's `errors` list only says that nothing was found
    (`{"error": "Nothing found", "error_number": 9003}`, or without a number a text that begins
    "Nothing found": "Nothing found with query"): an empty result, not a failure."""
    if not isinstance(errors, list) or not errors:
        return False
    for entry in errors:
        if not isinstance(entry, dict):
            return False
        number = next((entry[k] for k in ("error_number", "errno", "error_code") if k in entry), None)
        words = " ".join(str(entry.get(k) or "") for k in ("error", "description")).strip().lower()
        if (type(number) is int and number in INFORMATIONAL_ERRORS) or words == "nothing found":
            continue
        if number is not None or not words.startswith("nothing found"):
            return False
    return True


def parse_tres_string(text: str) -> dict[str, int]:
    """ "billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=256M,node=1" -> {"billing": 1, ..., "mem": 256}.

    mem/vmem become megabytes (the unit sacct JSON uses): 256M -> 256, 125G -> 128000, 3260K -> 3.
    Other suffixed counts are multiplied out (1K -> 1024). Entries whose value is not a count
    (TRESUsage's "cpu=00:00:05") or is negative are left out.
    """
    tres: dict[str, int] = {}
    if not text:
        return tres
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            continue
        count = _tres_count(key, value.strip())
        if count is not None:
            tres[key] = count
    return tres


def _tres_count(key: str, value: str) -> int | None:
    if value.isdigit() and value.isascii():
        return unwrap_number(int(value), 64)
    m = _TRES_VALUE.fullmatch(value)
    if not m:
        return None
    number, suffix = float(m.group(1)), m.group(2).upper()
    power = _SUFFIX_POWER.get(suffix, 0)
    if key in _MEGABYTE_TRES:
        # megabytes are power 2; K rounds to the nearest megabyte
        return round(number * 1024.0 ** (power - 2)) if suffix else round(number)
    return round(number * 1024.0**power)


def tres_key(tres_type: str, name: str | None) -> str:
    """JSON TRES item type/name -> the key sacct -P prints: ("gres", "gpu:h100") -> "gres/gpu:h100"."""
    return f"{tres_type}/{name}" if name else tres_type


def parse_tres_list(items: Iterable[Mapping[str, Any]] | None) -> dict[str, int]:
    """sacct JSON `tres.allocated` / `tres.requested` ([{type, name, id, count}]) -> name -> count.

    Counts that are null or negative (energy -2 = not measured) are left out.
    """
    tres: dict[str, int] = {}
    if not items:
        return tres
    for item in items:
        try:
            # the hot path of a bulk parse: subscripts, no method calls
            count = item["count"]
            name = item["name"]
            tres_type = item["type"]
        except (KeyError, TypeError):
            count = unwrap_number(item.get("count"))
            name = item.get("name")
            tres_type = item.get("type")
        if type(count) is not int or count >= NO_VAL32:
            # a number object, a TRES count of NO_VAL (not set), or no number at all
            count = unwrap_number(count, 64)
            if count is None:
                continue
        if count < 0 or not tres_type:
            continue
        tres[f"{tres_type}/{name}" if name else tres_type] = count
    return tres


def gpu_count(tres: Mapping[str, int]) -> int:
    """GPUs in a TRES map: gres/gpu, else the sum of the typed gres/gpu:<type> counts."""
    total = tres.get(GPU_KEY)
    if total is not None:
        return total
    return sum(count for key, count in tres.items() if key.startswith(_GPU_TYPED_PREFIX))


def gpu_model(tres: Mapping[str, int]) -> str:
    """The GPU type when the TRES name exactly one (gres/gpu:h100 -> "h100"), else ""."""
    models = [key[len(_GPU_TYPED_PREFIX) :] for key in tres if key.startswith(_GPU_TYPED_PREFIX)]
    return models[0] if len(models) == 1 else ""


def normalize_state(value: str | Sequence[str] | None) -> str:
    """A job state as sacct prints it, without decorations.

    "CANCELLED by 0" -> "CANCELLED"; "completed" -> "COMPLETED"; unknown words are kept ("FOO").
    A list (sacct JSON v0.0.40+: base state plus flags) -> what sacct's text output shows: a
    flag sacct reports instead of the base state (["PENDING", "REQUEUED"] -> "REQUEUED"), else
    the base state (["RUNNING"] -> "RUNNING").
    """
    if value is None:
        return ""
    if isinstance(value, str):
        words = value.split(None, 1)
        return words[0].upper() if words else ""
    states = [normalize_state(v) for v in value if isinstance(v, str)]
    states = [s for s in states if s]
    if not states:
        return ""
    if len(states) == 1:
        return states[0]
    for flag in SACCT_STATE_FLAGS:
        if flag in states:
            return flag
    for state in states:
        if state in BASE_STATES:
            return state
    return states[0]


def expand_nodelist(nodelist: str | None) -> tuple[str, ...]:
    """ "gpu[01-02,07]" -> ("gpu01", "gpu02", "gpu07"); "None assigned", "(null)", "" -> ().

    Raises ValueError for a list that python-hostlist cannot read.
    """
    if not nodelist:
        return ()
    return _expand_cached(nodelist.strip())


@lru_cache(maxsize=4096)
def _expand_cached(nodelist: str) -> tuple[str, ...]:
    # node lists repeat a lot across a bulk sacct call; expanding is ~10 us each
    if nodelist in NO_NODES:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as exc:
        raise ValueError(f"bad node list '{nodelist}': {exc}") from None


def parse_duration_seconds(text: str | None) -> int | None:
    """A Slurm time span as sacct prints it -> seconds; None for UNLIMITED, Partition_Limit, "".

    Forms: "D-HH:MM:SS", "HH:MM:SS", "MM:SS". Raises ValueError for anything else.
    """
    if text is None:
        return None
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "PARTITION_LIMIT", "INVALID", "NONE", "UNKNOWN"):
        return None
    m = _DURATION.fullmatch(text)
    if not m:
        raise ValueError(f"cannot read time span '{text}'")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def minutes_to_seconds(value: Any) -> int | None:
    """A time limit in minutes (int or Slurm number object) -> seconds; None when unset or infinite."""
    minutes = unwrap_number(value)
    if minutes is None or minutes < 0 or minutes >= NO_VAL32:
        return None
    return minutes * 60


# sbatch --output patterns ("filename pattern" in sbatch(1)): %% %A %a %b %j %J %N %n %s %t %u %x,
# a number between % and the letter zero-pads ("%4j")
_OUTPUT_PATTERN = re.compile(r"%(\d*)([%AabjJNnstux])")
DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"


def expand_output_pattern(
    pattern: str,
    *,
    job_id_raw: int,
    user: str,
    name: str,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
    first_node: str = "",
) -> str:
    """A batch job's --output pattern as slurmstepd expands it for the batch step.

    "slurm-%j.out" -> "slurm-123.out"; "%x-%A_%a.log" -> "train-10_4.log". For the batch step
    %s is "batch", %t and %n are 0 and %N is the first node's short name. A pattern that
    starts with a backslash is taken literally (the backslash dropped), as sbatch does.
    """
    if pattern.startswith("\\"):
        return pattern.replace("\\", "")
    values = {
        "A": str(array_job_id if array_job_id is not None else job_id_raw),
        "a": str(array_task_id if array_task_id is not None else 4294967294),
        "b": str(array_task_id % 10 if array_task_id is not None else 0),
        "j": str(job_id_raw),
        "J": str(job_id_raw),
        "N": first_node.split(".", 1)[0],
        "n": "0",
        "s": "batch",
        "t": "0",
        "u": user,
        "x": name,
    }

    def replace(m: re.Match[str]) -> str:
        width, letter = m.groups()
        if letter == "%":
            return "%"
        value = values[letter]
        if width and letter in "AabjJnt" and value.isdigit():
            return value.zfill(int(width))
        return value

    return _OUTPUT_PATTERN.sub(replace, pattern)


def output_option(submit_line: str) -> str:
    """The -o/--output value of an sbatch command line ("" when it has none or cannot be read).

    Options after --wrap (its command) are not sbatch's; a script's own arguments could be
    mistaken for it, which is why a JSON `stdout` from sacct is preferred to this.
    """
    import shlex

    try:
        words = shlex.split(submit_line)
    except ValueError:
        return ""
    found = ""
    for i, word in enumerate(words):
        if word == "--wrap" or word.startswith("--wrap="):
            break
        if word in ("-o", "--output") and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("--output="):
            found = word.split("=", 1)[1]
        elif word.startswith("-o") and not word.startswith("--") and len(word) > 2:
            found = word[2:]
    return found


def attempt_nodes(nodelist: str) -> tuple[str, tuple[str, ...]]:
    """(nodelist, nodes) of a job's allocation as an attempt keeps them: the nodes expanded; a
    list that cannot be expanded keeps its text with no nodes (the allocation still counts,
    only the per-node view is lost); one that names no node ("None assigned") is ""."""
    try:
        nodes = expand_nodelist(nodelist)
    except ValueError:
        return nodelist, ()
    return (nodelist if nodes else ""), nodes
