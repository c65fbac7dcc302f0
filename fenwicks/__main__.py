"""Command line: ``python -m fenwicks info|demo|bench|data-service``.

A user error (a bad option, a bad ``FENWICKS_DEVICE``, an absent accelerator, a work dir
that is a file, a missing optional package) is one line on stderr and exit status 2;
``--debug`` shows the traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import sys

EXIT_USER_ERROR = 2  # what argparse uses for bad options; the same for every user error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (not a usage block) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        name = self.prog.replace("python -m ", "")
        self.exit(EXIT_USER_ERROR, f"{name}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a sub-command's default must not overwrite `--debug` given before it.
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    parser = _Parser(prog="python -m fenwicks", description=__doc__.split("\n")[0])
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", parents=[debug],
                        help="print devices, strategy, precision and storage")
    demo = commands.add_parser("demo", parents=[debug],
                               help="train the tutorial-1 net on bundled digits")
    demo.add_argument("--epochs", type=int, default=None,
                      help="passes over the training digits (default 12)")
    demo.add_argument("--batch-size", type=int, default=None,
                      help="global batch size, divisible by the replicas (default 64)")
    demo.add_argument("--work-dir", default=None,
                      help="checkpoints and TensorBoard logs, local or gs://; a run there "
                           "is resumed (default: <storage root>/work/demo)")
    demo.add_argument("--fresh", action="store_true",
                      help="delete the previous run in the work dir (only Fenwicks' own "
                           "files; a folder holding others is refused) and start over")
    bench = commands.add_parser("bench", parents=[debug],
                                help="matmul TFLOPS on CPU and accelerators")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--n", type=int, default=None, help="matrix size N (N x N)")
    bench.add_argument("--repeats", type=int, default=None,
                       help="chained products per timed call")
    bench.add_argument("--trials", type=int, default=5,
                       help="timed calls per row (min/median/max)")
    _add_data_service(commands, debug)
    return parser


def _add_data_service(commands, debug: argparse.ArgumentParser) -> None:
    service = commands.add_parser(
        "data-service", parents=[debug],
        help="serve training input from this machine (a tf.data service dispatcher or "
             "worker; runs until stopped)")
    roles = service.add_subparsers(dest="role", required=True)
    dispatcher = roles.add_parser("dispatcher", parents=[debug],
                                  help="hand out input work to the workers")
    dispatcher.add_argument("--port", type=int, required=True,
                            help="port the trainers and workers connect to")
    dispatcher.add_argument("--work-dir", default=None,
                            help="journal (local or gs://) so a restarted dispatcher "
                                 "continues its jobs")
    dispatcher.add_argument("--bind", default="localhost", help=_BIND_HELP)
    worker = roles.add_parser("worker", parents=[debug],
                              help="read, decode and batch input for the trainers")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    worker.add_argument("--port", type=int, default=0, help="this worker's port "
                        "(default: any free port)")
    worker.add_argument("--host", default=None, help="the name trainers reach this "
                        "worker by (default: the --bind address; this machine's name "
                        "with --bind 0.0.0.0)")
    worker.add_argument("--bind", default="localhost", help=_BIND_HELP)


# The tf.data service has no authentication: a server reachable from elsewhere runs
# whatever dataset code a client sends, so nothing listens beyond loopback by default.
_BIND_HELP = ("address to listen on (default: localhost, this machine only). The tf.data "
              "service has no authentication: with 0.0.0.0 or a network address anyone "
              "who can reach the port can run code as you; use a private network or a "
              "firewall, never a public address")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the request or the environment is wrong, not Fenwicks."""
    basic = (ValueError, ImportError, OSError)
    try:
        import tensorflow as tf

        from fenwicks import accel
    except ImportError:  # no TensorFlow: `import fenwicks` said what to install
        return basic
    return (*basic, accel.AcceleratorError, tf.errors.NotFoundError,
            tf.errors.PermissionDeniedError, tf.errors.FailedPreconditionError,
            tf.errors.AlreadyExistsError)


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _run(args: argparse.Namespace) -> int:
    import fenwicks as fw

    if args.command == "info":
        fw.info()
    elif args.command == "demo":
        from fenwicks import demo

        demo.report(epochs=args.epochs, batch_size=args.batch_size, work_dir=args.work_dir,
                    fresh=args.fresh)
    elif args.command == "bench":
        from fenwicks import bench  # not imported by `import fenwicks`

        report = bench.run(n=args.n, repeats=args.repeats, trials=args.trials)
        print(json.dumps(report.as_dict()) if args.json else report.table())
    elif args.command == "data-service":
        _serve(args)
    return 0


def _reach_by(address: str, bind: str) -> str:
    """The host part of ``--dispatcher`` for a dispatcher listening on `address`."""
    if ipaddress.ip_address(address).is_unspecified:
        return socket.gethostname()
    if address == "127.0.0.1":
        return "localhost"
    return f"[{address}]" if ":" in address else bind  # IPv6 in brackets: [::1]:5050


def _serve(args: argparse.Namespace) -> None:
    """Runs a tf.data service server until the process is stopped."""
    from fenwicks.data import service

    if args.role == "dispatcher":
        server = service.start_dispatcher(args.port, work_dir=args.work_dir, bind=args.bind)
        name = _reach_by(service.listen_address(args.bind), args.bind)
        print(f"fenwicks data-service: dispatcher at grpc://{name}:{args.port} (listening "
              f"on {args.bind}); start workers with `python -m fenwicks data-service "
              f"worker --dispatcher {name}:{args.port}`", flush=True)
    else:
        server = service.start_worker(args.dispatcher, port=args.port, host=args.host,
                                      bind=args.bind)
        print(f"fenwicks data-service: worker registered with {args.dispatcher} "
              f"(listening on {args.bind})", flush=True)
    server.join()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"fenwicks {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        if args.debug or not isinstance(err, _user_errors()):
            raise
        print(f"fenwicks {args.command}: error: {_one_line(err)} (--debug shows where)",
              file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
