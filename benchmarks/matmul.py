"""TensorFlow vs numpy float32 matmul TFLOPS on this CPU, over matrix sizes.

    python benchmarks/matmul.py                       # sizes 512..4096, oneDNN and XLA
    python benchmarks/matmul.py --sizes 2048 --trials 9

Both run the same chain C <- C @ B (`--repeats` products per call), timed interleaved
(TF, numpy, TF, numpy, ...) so that load from other processes hits both alike. Prints
the median TFLOPS of each, their ratio (median of the per-round ratios), and the
min-max spread. Acceptance for
`python -m fenwicks bench`: TF / numpy >= 0.9 at the default size.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fenwicks as fw  # noqa: E402  (after the path tweak, to run from a checkout)
from benchmarks import _results  # noqa: E402


def _threads() -> str:
    import numpy as np
    import tensorflow as tf

    threading = tf.config.threading
    inter, intra = (threading.get_inter_op_parallelism_threads(),
                    threading.get_intra_op_parallelism_threads())
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return (f"TF inter/intra-op threads {inter}/{intra} (0 = all cores); "
            f"numpy BLAS {blas.get('name', '?')} {blas.get('version', '')}; "
            f"{len(os.sched_getaffinity(0))} CPUs usable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=None,
                        help="products per call; default: about 2e10 FLOPs per call")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--no-xla", action="store_true", help="skip the XLA rows")
    parser.add_argument("--intra-op-threads", type=int, default=None,
                        help="TF's intra-op threads (default 0: all cores), to check that "
                             "TF really uses every core")
    _results.add_option(parser)
    args = parser.parse_args(argv)
    if args.intra_op_threads is not None:  # must precede TF's first op
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

    print(fw.bench.cpu_info().describe())
    print(_threads())
    print(f"{'N':>6}{'engine':>8}{'reps':>6}{'TF med':>9}{'np med':>9}{'TF/np':>7}"
          f"{'TF min-max':>16}{'np min-max':>16}")
    rows = []
    for n in args.sizes:
        # at least ~20 GFLOPs per call: ~0.2 s here, long against the clock's overhead
        repeats = args.repeats or max(1, round(2e10 / fw.bench.matmul_flop_count(n)))
        for jit in (None,) if args.no_xla else (None, True):
            ours, ref = fw.bench.cpu_vs_numpy(n, repeats, args.trials, jit_compile=jit)
            print(f"{n:>6}{'XLA' if jit else 'default':>8}{repeats:>6}{ours.tflops:>9.3f}"
                  f"{ref.tflops:>9.3f}{fw.bench.speed_ratio(ours, ref):>7.2f}"
                  f"{ours.min_tflops:>8.3f}-{ours.max_tflops:<7.3f}"
                  f"{ref.min_tflops:>8.3f}-{ref.max_tflops:<7.3f}", flush=True)
            rows.append({"N": n, "engine": "XLA" if jit else "default", "reps": repeats,
                         "TF TFLOPS": round(ours.tflops, 3), "numpy TFLOPS": round(ref.tflops, 3),
                         "TF/numpy": round(fw.bench.speed_ratio(ours, ref), 2)})
    if args.results:
        _results.write(__file__, "TensorFlow vs numpy float32 matmul on the CPU (medians)",
                       rows, argv, summary="target for python -m fenwicks bench: "
                       "TF/numpy >= 0.9 at N = 2048")
    return 0


if __name__ == "__main__":
    sys.exit(main())
