"""Command line: ``python -m fenwicks info|demo|bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fenwicks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="print devices, strategy, precision and storage")
    demo = commands.add_parser("demo", help="train the tutorial-1 net on bundled digits")
    demo.add_argument("--epochs", type=int, default=None,
                      help="passes over the training digits (default 12)")
    demo.add_argument("--batch-size", type=int, default=None,
                      help="global batch size, divisible by the replicas (default 64)")
    demo.add_argument("--work-dir", default=None,
                      help="checkpoints and TensorBoard logs, local or gs://; a run there "
                           "is resumed (default: a fresh <storage root>/work/demo)")
    bench = commands.add_parser("bench", help="matmul TFLOPS on CPU and accelerators")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--n", type=int, default=None, help="matrix size N (N x N)")
    bench.add_argument("--repeats", type=int, default=None,
                       help="chained products per timed call")
    bench.add_argument("--trials", type=int, default=5,
                       help="timed calls per row (min/median/max)")
    args = parser.parse_args(argv)

    import fenwicks as fw

    if args.command == "info":
        fw.info()
    elif args.command == "demo":
        from fenwicks import demo as demo_module

        return demo_module.run(epochs=args.epochs, batch_size=args.batch_size,
                               work_dir=args.work_dir)
    elif args.command == "bench":
        return fw.bench.main(json_output=args.json, n=args.n, repeats=args.repeats,
                             trials=args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
