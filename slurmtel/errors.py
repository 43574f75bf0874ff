"""Error classes. Every failure a run records is one of these (DESIGN: errors classified)."""

from __future__ import annotations


class SlurmtelError(Exception):
    """Base class; `kind` is what a collect run records as its error class."""

    kind = "error"
    # what the run had stored before it failed (a RunResult), recorded with the failed run;
    # set by sources that store in steps, such as sacct's chunks
    partial_result: object = None


class ConfigError(SlurmtelError):
    """The configuration is invalid (unknown key, wrong type, unreadable file)."""

    kind = "config_error"


class SourceUnavailable(SlurmtelError):
    """A source could not be read: command missing, timed out, exited non-zero, host down."""

    kind = "source_unavailable"


class ParseError(SlurmtelError):
    """Input that cannot be read as a whole (truncated JSON, unknown schema, missing column).

    Single bad records are not errors: they become `Rejected` records and are quarantined.
    """

    kind = "parse_error"


class AccessDenied(SlurmtelError):
    """The caller may not do this (slurmtel.access.allowed gave no scope): deny by default."""

    kind = "access_denied"


class DatabaseUnavailable(SlurmtelError):
    """PostgreSQL could not be reached."""

    kind = "database_unavailable"


class SchemaMissing(SlurmtelError):
    """The database has no slurmtel schema, or an older one: run `slurmtel db upgrade`."""

    kind = "schema_missing"


class ChargebackError(SlurmtelError):
    kind = "chargeback_error"


class AuthenticationFailed(SlurmtelError):
    """A request's credential was missing, malformed, forged or not good for this request."""

    kind = "auth_failed"


class CredentialInvalid(AuthenticationFailed):
    """Not a credential this site issued: garbled, tampered with, another key, wrong algorithm."""

    kind = "credential_invalid"


class CredentialExpired(AuthenticationFailed):
    """A genuine credential past its lifetime (or one dated in the future: a rewound clock)."""

    kind = "credential_expired"


class CredentialReplayed(AuthenticationFailed):
    """A genuine credential seen before: each one is good for one request."""

    kind = "credential_replayed"


class AuthUnavailable(SlurmtelError):
    """The credential could not be checked: munged down, unmunge missing or timed out."""

    kind = "auth_unavailable"


# SQLSTATE classes whose server messages quote the values of the row or the statement
# (22: data exception, "invalid input syntax for type integer: ..."; 23: integrity, "Key (user)=(...)")
_VALUE_CLASSES = ("22", "23")


def described(exc: BaseException) -> str:
    """EXC in one line that holds no SQL, no statement parameters and no row values, whatever
    raised it: a driver error wrapped by SQLAlchemy (whose str() appends the statement and its
    parameters) as its class, SQLSTATE and the names of the table, column and constraint
    concerned; anything else as its type and first line. For logs and recorded runs, which a
    flood of bad input could otherwise fill with the input's values."""
    orig = getattr(exc, "orig", None)
    error = orig if isinstance(orig, BaseException) else exc
    sqlstate = getattr(error, "sqlstate", None)
    name = type(error).__name__
    if isinstance(sqlstate, str) and sqlstate[:2] in _VALUE_CLASSES:
        diag = getattr(error, "diag", None)
        where = [
            f"{label} {value}"
            for label, value in (
                ("table", getattr(diag, "table_name", None)),
                ("column", getattr(diag, "column_name", None)),
                ("constraint", getattr(diag, "constraint_name", None)),
            )
            if value
        ]
        return f"{name} (SQLSTATE {sqlstate}{', ' + ', '.join(where) if where else ''})"
    if error is exc and orig is None and hasattr(exc, "statement"):
        # an SQLAlchemy error of its own (no driver error): its message without the statement
        text = str(getattr(exc, "args", ("",))[0] if getattr(exc, "args", None) else "")
    else:
        diag = getattr(error, "diag", None)
        text = getattr(diag, "message_primary", None) or str(error)
    lines = text.strip().splitlines()
    return f"{name}: {lines[0]}" if lines else name


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as KeyboardInterrupt is for SIGINT (slurmtel.cli), so
    that a terminated command unwinds and exits like any other: its transactions roll back and
    the embedded PostgreSQL it started stops (pgserver's atexit)."""
