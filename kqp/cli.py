"""The `kqp` command line: serve, check-config, capture inspect, replay."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _raise_open_file_limit() -> None:
    """Every proxied connection holds two descriptors (client and upstream): allow the hard limit.

    Soft limits are often 1024, which would cap the proxy near 500 clients.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return  # an unlimited hard limit is still capped by fs.nr_open; leave the soft one alone
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _serve(args: argparse.Namespace) -> int:
    from kqp.config.models import CommandLine
    from kqp.proxy.app import configure_logging, load_serve_setup, serve_forever

    _raise_open_file_limit()
    overrides = CommandLine(
        upstream=tuple(args.upstream or ()),
        bootstrap_port=args.bootstrap_port,
        node_port_base=args.node_port_base,
        advertised_host=args.advertised_host,
        bind_host=args.bind_host,
        metrics_port=args.metrics_port,
        capture_dir=args.capture_dir,
    )
    if args.workers < 1:
        print("kqp serve: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers == 1:
        return serve_forever(args.config or [], overrides)
    from kqp.proxy.workers import serve_workers

    configure_logging()
    setup = load_serve_setup(args.config or [], overrides)
    return 2 if setup is None else serve_workers(setup, args.workers)


def _check_config(args: argparse.Namespace) -> int:
    from kqp.config.check import check_config_command

    status: int = check_config_command(args.files)
    return status


def _capture_inspect(args: argparse.Namespace) -> int:
    from kqp.capture.inspect import inspect_command

    return inspect_command(args.directory)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kqp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", action="append", help="config file (repeatable; later files override)")
    serve.add_argument("--upstream", action="append", metavar="HOST:PORT", help="upstream bootstrap broker")
    serve.add_argument("--bootstrap-port", type=int, help="port clients bootstrap from")
    serve.add_argument("--node-port-base", type=int, help="broker N is served on this port + N")
    serve.add_argument("--advertised-host", help="host name clients are told to connect to")
    serve.add_argument("--bind-host", help="address to listen on")
    serve.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz and /readyz")
    serve.add_argument("--capture-dir", help="capture every request to Parquet files under this folder")
    serve.add_argument("--workers", type=int, default=1,
                       help="proxy processes sharing every port (SO_REUSEPORT) and one budget (default 1)")
    serve.set_defaults(func=_serve)

    check = commands.add_parser("check-config", help="validate config files and print effective quotas")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=_check_config)

    capture = commands.add_parser("capture", help="work with traffic captures")
    capture_commands = capture.add_subparsers(dest="capture_command", required=True)
    inspect = capture_commands.add_parser("inspect", help="coverage, time span and volume of a capture")
    inspect.add_argument("directory")
    inspect.set_defaults(func=_capture_inspect)

    # `kqp replay ...` hands its arguments to the Spark jobs' own parser.
    commands.add_parser("replay", help="Spark jobs: analyze, whatif, live", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "replay":
        from kqp.spark_jobs.cli import main as replay_main

        return replay_main(argv[1:])
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
