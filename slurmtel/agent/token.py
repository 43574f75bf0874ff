"""The agent's bearer token: /v1/* are never served without one.

With `agent.token_file` set, that file holds it. Without, the agent makes its own on first
start, `agent-token` beside its spool (<state_dir>/agent-token by default): 32 random bytes,
URL-safe base64, mode 0600, written to a temporary file and linked into place, so a reader
never sees half a token and two agents starting at once end up with the same one. The head
reads it through sources.agent.token_dir (one file per node) or token_file (shared).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from slurmtel.errors import ConfigError

TOKEN_FILE_NAME = "agent-token"
# a shorter token is a typo or a placeholder, not a secret
MIN_TOKEN_CHARS = 16


def check_token(token: str, where: str) -> str:
    """TOKEN when it can be one: at least MIN_TOKEN_CHARS, printable, no space, NUL or other
    control character inside (a NUL or a line break in a header is a different token to
    different parsers); ConfigError naming WHERE otherwise."""
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(
            f"{where}: needs one token of at least {MIN_TOKEN_CHARS} characters, with no space, NUL "
            "or control character in it"
        )
    return token


def read_token_file(path: Path, where: str, *, private: bool = True) -> str:
    """The token in PATH (surrounding whitespace, such as the final newline, left out).
    ConfigError when the file is writable by its group or by every user (anyone could put their
    own token there), when PRIVATE and every user may read it, or when the token cannot be one
    (check_token). FileNotFoundError when there is no file."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} {path}: cannot read: {exc}") from exc
    if mode & (stat.S_IWGRP | stat.S_IWOTH) or (private and mode & stat.S_IROTH):
        who = "every user read or write" if mode & (stat.S_IROTH | stat.S_IWOTH) else "its group write"
        raise ConfigError(f"{where} {path}: mode {stat.S_IMODE(mode):04o} lets {who} it (chmod 0600 {path})")
    return check_token(token, f"{where} {path}")


def read_token(path: Path) -> str:
    """The agent's token in PATH. ConfigError when it is empty, too short, holds a space, NUL or
    control character, or the file is readable by others or writable by anyone but its owner
    (any local user could then read the spool's job ids or drop it with an ack)."""
    return read_token_file(path, "agent token file")


def ensure_token(path: Path) -> tuple[str, bool]:
    """The token in PATH, made (mode 0600) when there is none; and whether it was made now."""
    try:
        return read_token(path), False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{token}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # link, not rename: never replaces a token another agent made in the meantime
        os.link(partial, path)
    except FileExistsError:
        return read_token(path), False
    finally:
        partial.unlink()
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return token, True
