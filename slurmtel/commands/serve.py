"""`slurmtel serve`: the read API (slurmtel.api.app) on uvicorn, as its own systemd unit."""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path

from slurmtel.commands.common import EXIT_OK, coordinated_accounts
from slurmtel.config import Config
from slurmtel.errors import ConfigError, SlurmtelError, Terminated

log = logging.getLogger("slurmtel.serve")


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="the read API for login nodes and portals: reports, jobs, me, statements ([api]; MUNGE, JWT)",
    )
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    import uvicorn

    from slurmtel.api.app import CoordinatorCache, ReadApi, build_app
    from slurmtel.api.limits import ApiLimits, ListenerState, uvicorn_options
    from slurmtel.auth.identity import AuthSettings
    from slurmtel.clock import site_clock
    from slurmtel.config import check_database_url
    from slurmtel.sources.base import utc_now
    from slurmtel.store.engine import make_engine, normalize_url, require_schema
    from slurmtel.store.rls import scope_sessions_to_everything

    api = config.api
    # the port first: a busy one is said in one line (exit 1) before a database is opened or
    # an embedded one started; uvicorn serves on this socket
    listener = listening_socket(api.listen_address, api.port)
    statements_url = None
    if api.statements_database_url_file:
        try:
            text = Path(api.statements_database_url_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"api.statements_database_url_file: {exc}") from exc
        origin = f"api.statements_database_url_file ({api.statements_database_url_file})"
        statements_url = normalize_url(check_database_url(text, origin))
    engine = make_engine(config)
    require_schema(engine, config.database_description())
    statements_engine = scope_sessions_to_everything(make_engine(config, statements_url))
    settings = AuthSettings.from_config(
        config, CoordinatorCache(lambda user: coordinated_accounts(config, user))
    )
    limits = ListenerState(ApiLimits.from_config(config.api))
    app = build_app(ReadApi(config, engine, settings, site_clock(config, utc_now), statements_engine), limits)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            ssl_certfile=api.tls_cert_file or None,
            ssl_keyfile=api.tls_key_file or None,
            # the peer address is the socket's: X-Forwarded-For is never believed here (trusted
            # proxies are api.trusted_proxies, checked by slurmtel.auth)
            proxy_headers=False,
            server_header=False,
            log_config=None,
            # connections, request time and keep-alive bounded (slurmtel.api.limits); the
            # socket (listening_socket) holds the accept backlog
            **uvicorn_options(limits),
        )
    )
    scheme = "https" if api.tls_cert_file else "http"
    log.info("read API listening on %s://%s:%d", scheme, api.listen_address, listener.getsockname()[1])
    try:
        # uvicorn stops on SIGTERM and SIGINT by itself, then raises the signal again:
        # Terminated or KeyboardInterrupt here is the end of a clean stop
        server.run(sockets=[listener])
    except (Terminated, KeyboardInterrupt):
        if not server.started:
            raise
    finally:
        listener.close()
        engine.dispose()
        statements_engine.dispose()
    if not server.started:
        raise SlurmtelError("slurmtel serve did not start (see the lines above)")
    return EXIT_OK


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on HOST:PORT (IPv4 or IPv6, as the address is written), or
    SlurmtelError in one line naming the address and why (a port in use, an address not here)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        raise SlurmtelError(
            f"api.listen_address/api.port: cannot listen on {shown}: {exc.strerror or exc}"
        ) from None
    return sock
