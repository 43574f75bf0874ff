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


def read_token(path: Path) -> str:
    """The token in PATH. ConfigError when it is empty, too short, or readable or writable by
    others (any local user could then read the spool's job ids or drop it with an ack)."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"agent token file {path}: cannot read: {exc}") from exc
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(
            f"agent token file {path}: mode {stat.S_IMODE(mode):04o} lets every user read or write it "
            f"(chmod 0600 {path})"
        )
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(
            f"agent token file {path}: needs one token of at least {MIN_TOKEN_CHARS} characters"
        )
    return token


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
