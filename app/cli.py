"""``messagex serve | migrate | openapi | asyncapi | database-url``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from app import logs
from app.config import Settings, SettingsError, load_settings

log = logging.getLogger("messagex")


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from app.main import create_app
    from app.runtime import raise_open_files_limit
    from app.server import build_server, run_workers

    limit = raise_open_files_limit()
    if limit < 16384:
        log.warning("open files limited to %d: at most that many WebSockets", limit)
    overrides = {}
    if args.no_migrate:
        overrides["migrate_on_start"] = False
    if overrides:
        settings = settings.model_copy(update=overrides)
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    workers = args.workers if args.workers is not None else settings.workers
    if workers > 1:
        return run_workers(settings, host, port, workers)
    app = create_app(settings)
    # uvicorn re-raises SIGTERM after its graceful shutdown: make that a clean exit (0).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    build_server(app, settings, host, port, own_process=True).run()
    return 0


def _migrate(settings: Settings, args: argparse.Namespace) -> int:
    from app import runtime

    async def run() -> None:
        async with runtime.database(settings) as url:
            await runtime.migrate(url, args.revision, settings.database_pool_mode)

    asyncio.run(run())
    log.info("database at %s", args.revision)
    return 0


def _database_url(settings: Settings, args: argparse.Namespace) -> int:
    """Print the broker's database URL, for services that publish and ack in their own
    transactions (contract §18): DATABASE_URL as set, else the running embedded server's."""
    if settings.database_url is not None:
        from app.storage.dsn import libpq_url

        print(libpq_url(settings.database_url))  # several hosts: as every client reads them
        return 0
    from app.runtime import embedded_database_url

    url = embedded_database_url(settings.data_dir)
    if url is None:
        print(
            f"messagex: no embedded PostgreSQL is running in {settings.data_dir}: start the "
            "broker first (make run, or messagex serve) and keep it running",
            file=sys.stderr,
        )
        return 1
    print(url)
    return 0


def openapi_document(settings: Settings) -> str:
    from app.main import create_app

    return json.dumps(create_app(settings).openapi(), indent=2, sort_keys=False) + "\n"


def _openapi(settings: Settings, args: argparse.Namespace) -> int:
    _write(args.output, openapi_document(settings))
    return 0


def _asyncapi(settings: Settings, args: argparse.Namespace) -> int:
    from app.api.asyncapi import document

    _write(args.output, json.dumps(document(), indent=2, sort_keys=False) + "\n")
    return 0


def _write(output: str, text: str) -> None:
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="messagex", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker")
    serve.add_argument("--host", help="listen address (default MESSAGEX_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default MESSAGEX_PORT or 8000)")
    serve.add_argument("--no-migrate", action="store_true", help="do not migrate at start-up")
    serve.add_argument(
        "--workers",
        type=int,
        help="broker processes sharing the port (default MESSAGEX_WORKERS or 1)",
    )
    serve.set_defaults(func=_serve)
    migrate = sub.add_parser("migrate", help="migrate the database to the latest schema")
    migrate.add_argument("--revision", default="head")
    migrate.set_defaults(func=_migrate)
    oa = sub.add_parser("openapi", help="write the OpenAPI document")
    oa.add_argument("--output", "-o", default="openapi/openapi.json", help="file, or - for stdout")
    oa.set_defaults(func=_openapi)
    aa = sub.add_parser("asyncapi", help="write the WebSocket protocol's AsyncAPI document")
    aa.add_argument("--output", "-o", default="openapi/asyncapi.json", help="file, or - for stdout")
    aa.set_defaults(func=_asyncapi)
    url = sub.add_parser(
        "database-url",
        help="print the broker's database URL (DATABASE_URL, or the running embedded server's)",
    )
    url.set_defaults(func=_database_url)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"messagex: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    try:
        code: int = args.func(settings, args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
