"""`slurmtel serve`: the read API (slurmtel.api.app) on uvicorn, as its own systemd unit."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmtel.commands.common import EXIT_OK, coordinated_accounts
from slurmtel.config import Config
from slurmtel.errors import ConfigError


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
    from slurmtel.sources.base import utc_now
    from slurmtel.store.engine import make_engine, normalize_url, require_schema
    from slurmtel.store.rls import scope_sessions_to_everything

    engine = make_engine(config)
    require_schema(engine)
    statements_url = None
    if config.api.statements_database_url_file:
        try:
            statements_url = normalize_url(Path(config.api.statements_database_url_file).read_text().strip())
        except OSError as exc:
            raise ConfigError(f"api.statements_database_url_file: {exc}") from exc
    statements_engine = scope_sessions_to_everything(make_engine(config, statements_url))
    settings = AuthSettings.from_config(
        config, CoordinatorCache(lambda user: coordinated_accounts(config, user))
    )
    listener = ListenerState(ApiLimits.from_config(config.api))
    app = build_app(
        ReadApi(config, engine, settings, site_clock(config, utc_now), statements_engine), listener
    )
    api = config.api
    uvicorn.run(
        app,
        host=api.listen_address,
        port=api.port,
        ssl_certfile=api.tls_cert_file or None,
        ssl_keyfile=api.tls_key_file or None,
        # the peer address is the socket's: X-Forwarded-For is never believed here (trusted
        # proxies are api.trusted_proxies, checked by slurmtel.auth)
        proxy_headers=False,
        server_header=False,
        log_config=None,
        # connections, request time, keep-alive and the accept backlog bounded (slurmtel.api.limits)
        **uvicorn_options(listener),
    )
    return EXIT_OK
