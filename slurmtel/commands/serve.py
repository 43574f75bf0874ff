"""`slurmtel serve`: the read API (slurmtel.api.app) and the HTML pages (slurmtel.pages) on
uvicorn, as its own systemd unit.

`--dev-user NAME` is the local development identity (the demo's way to open the pages): every
request from this machine is NAME. It is refused unless the server listens on a loopback
address only (127.0.0.1, ::1), and the server says so in its log at start."""

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
        help="the read API and the pages for login nodes and portals: reports, jobs, me, statements "
        "([api]; MUNGE, JWT, a trusted proxy)",
    )
    serve.add_argument(
        "--listen", metavar="ADDRESS", help="listen on ADDRESS instead of api.listen_address (e.g. 127.0.0.1)"
    )
    serve.add_argument("--port", type=int, metavar="PORT", help="listen on PORT instead of api.port")
    serve.add_argument(
        "--dev-user",
        metavar="NAME",
        default="",
        help="LOCAL DEVELOPMENT ONLY: treat every request from this machine as user NAME (no credential); "
        "refused unless listening on 127.0.0.1 or ::1",
    )
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    import uvicorn

    from slurmtel.api.app import CoordinatorCache, ReadApi, build_app
    from slurmtel.api.limits import ApiLimits, ListenerState, uvicorn_options
    from slurmtel.auth.identity import AuthSettings
    from slurmtel.auth.proxy import is_loopback, valid_user_name
    from slurmtel.clock import site_clock
    from slurmtel.config import check_database_url
    from slurmtel.pages.app import Pages
    from slurmtel.sources.base import utc_now
    from slurmtel.store.engine import make_engine, normalize_url, require_schema
    from slurmtel.store.rls import scope_sessions_to_everything

    api = config.api
    address = getattr(args, "listen", None) or api.listen_address
    port = api.port if getattr(args, "port", None) is None else args.port
    dev_user = getattr(args, "dev_user", "") or ""
    if dev_user:
        if not valid_user_name(dev_user):
            raise ConfigError(f"--dev-user: {dev_user!r} is not a user name")
        if not is_loopback(address):
            raise ConfigError(
                f"--dev-user trusts every request without a credential: it listens on 127.0.0.1 or ::1 "
                f"only, not {address} (give --listen 127.0.0.1)"
            )
    # the port first: a busy one is said in one line (exit 1) before a database is opened or
    # an embedded one started; uvicorn serves on this socket
    listener = listening_socket(address, port)
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
    # ReadApi signs the engine's sessions with the scope key as each connects: the connection
    # the schema check opened must not stay in the pool unsigned (every scope would be refused)
    engine.dispose()
    statements_engine = scope_sessions_to_everything(make_engine(config, statements_url))
    settings = AuthSettings.from_config(
        config, CoordinatorCache(lambda user: coordinated_accounts(config, user))
    )
    limits = ListenerState(ApiLimits.from_config(config.api))
    read_api = ReadApi(
        config, engine, settings, site_clock(config, utc_now), statements_engine, dev_user=dev_user
    )
    app = build_app(read_api, limits, pages=Pages(read_api).routes())
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
    shown = f"[{address}]" if ":" in address else address
    log.info("read API and pages listening on %s://%s:%d", scheme, shown, listener.getsockname()[1])
    if dev_user:
        log.warning(
            "DEVELOPMENT IDENTITY: every request from this machine is %s (--dev-user); never in production",
            dev_user,
        )
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
