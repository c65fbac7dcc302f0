"""Can the input pipeline keep up? `Estimator.check_input` times the input alone and
compares it with the training speed of the last `train` call.

    est.train(train_input_func, steps=1000)
    print(est.check_input(train_input_func))
    # input delivers 41,200 ex/s, training consumed 3,100 ex/s (13.29x): not input-bound

The input is timed the way training consumes it: the same ``params`` (per-replica batch
size, seed, input context) and the same engine's reading, on this host, after a few
warm-up batches (tf.data's autotuning, the first file reads, the loop's compilation). On
the TensorFlow engine a compiled loop pulls the strategy's distributed dataset, as the
training loop does; on the JAX engine the global batches are read as NumPy and copied to
the mesh's devices, as its trainer does (`fenwicks.train.jax.inputs`).

The verdict (thresholds in `INPUT_BOUND_BELOW`, `CLOSE_BELOW`): a prefetching pipeline
runs beside the training step, so when the input is the slower of the two training runs
at the input's speed and the ratio input / training is about 1. The ratio must therefore
clearly exceed 1 for the input to be keeping up.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from fenwicks import _tf_internals, accel
from fenwicks._checks import positive_int
from fenwicks.train import engines, inputs
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.runner import InputExhaustedError

logger = logging.getLogger("fenwicks")

# Input-bound below 1.1x: when the input is the bottleneck training runs at the input's
# speed, so the ratio is 1 up to timing noise (a few % on a busy host) and the prefetch
# buffer that fills between compiled loops (which lets training look slightly faster).
INPUT_BOUND_BELOW = 1.1
# Below 1.5x the input has little headroom: on a CPU host the input measured alone had
# the cores to itself, which it shares with the training step during training; a heavier
# augmentation or a faster accelerator makes it the bottleneck.
CLOSE_BELOW = 1.5

INPUT_BOUND, CLOSE, NOT_INPUT_BOUND, NO_TRAINING_RATE = (
    "input-bound", "close to input-bound", "not input-bound", "no verdict")

_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
_FILE_READERS = frozenset({"TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset",
                           "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2"})


@dataclasses.dataclass(frozen=True)
class InputVerdict:
    """What `Estimator.check_input` measured; ``str()`` is the one-line summary.

    Attributes:
        input_examples_per_sec: examples per second the input delivered alone (global:
            one batch per replica per step, as training counts them).
        train_examples_per_sec: examples per second the last `train` call consumed
            (the median over its compiled loops, its first loop, with compilation, left
            out when there are others), or None if nothing was trained yet.
        ratio: input / training, or None without a training rate.
        verdict: ``'input-bound'`` (ratio < 1.1), ``'close to input-bound'``
            (< 1.5), ``'not input-bound'`` or ``'no verdict'`` (no training rate).
        advice: the fixes that apply to this pipeline, most effective first; empty when
            the input keeps up.
        num_batches: steps timed (one batch per replica each), warm-up excluded.
        seconds: how long those steps took.

    Examples:
        >>> verdict = InputVerdict(input_examples_per_sec=41200.0,   # est.check_input's
        ...                        train_examples_per_sec=3100.0, ratio=41200 / 3100,
        ...                        verdict='not input-bound', advice=(), num_batches=100,
        ...                        seconds=0.08)
        >>> verdict.input_bound
        False
        >>> print(verdict)
        input delivers 41,200 ex/s, training consumed 3,100 ex/s (13.29x): not input-bound
    """

    input_examples_per_sec: float
    train_examples_per_sec: float | None
    ratio: float | None
    verdict: str
    advice: tuple[str, ...]
    num_batches: int
    seconds: float

    @property
    def input_bound(self) -> bool:
        """True if the input is the bottleneck (ratio below `INPUT_BOUND_BELOW`)."""
        return self.verdict == INPUT_BOUND

    def __str__(self) -> str:
        line = f"input delivers {self.input_examples_per_sec:,.0f} ex/s, "
        if self.train_examples_per_sec is None:
            return line + ("training consumed - ex/s (no steps trained by this "
                           "estimator yet): no verdict; train, then check_input again")
        line += (f"training consumed {self.train_examples_per_sec:,.0f} ex/s "
                 f"({self.ratio:.2f}x): {self.verdict}")
        if self.advice:
            line += "; fix: " + "; ".join(self.advice)
        return line


def judge(input_rate: float, train_rate: float | None) -> tuple[float | None, str]:
    """``(ratio, verdict)`` for the two rates in examples/s (see the thresholds).

    Examples:
        >>> judge(330.0, 320.0)
        (1.03125, 'input-bound')
    """
    if train_rate is None:
        return None, NO_TRAINING_RATE
    ratio = input_rate / train_rate
    if ratio < INPUT_BOUND_BELOW:
        return ratio, INPUT_BOUND
    return ratio, CLOSE if ratio < CLOSE_BELOW else NOT_INPUT_BOUND


def training_rate(loops: Sequence[tuple[int, float]]) -> float | None:
    """The examples/s of one `train` call from its ``(step, examples/s)`` per loop.

    The median, so that one slow loop (a checkpoint written to a bucket, a garbage
    collection) does not move it; the first loop includes the compilation of the
    training loop, so it is left out when there are others.

    Examples:
        >>> training_rate([(10, 150.0), (20, 3000.0), (30, 3100.0), (40, 2900.0)])
        3000.0
    """
    rates = [rate for _, rate in loops]
    if len(rates) > 1:
        rates = rates[1:]
    return statistics.median(rates) if rates else None


def advice(dataset: tf.data.Dataset) -> tuple[str, ...]:
    """The fixes that apply to `dataset`, read from its graph, most effective first.

    Examples:
        >>> with tf.io.TFRecordWriter('train.tfrec') as writer:
        ...     writer.write(b'record')
        >>> for fix in advice(tf.data.TFRecordDataset('train.tfrec').map(tf.strings.length)
        ...                   .batch(32)):
        ...     print(fix)
        cache after decoding (fw.data.tfrecord_ds(..., cache=True), or .cache() after the
          parsing map)
        more parallel maps (num_parallel_calls=tf.data.AUTOTUNE; fw.transform
          augmentations after batching)
        more parallel reads (num_parallel_reads=tf.data.AUTOTUNE, several files)
        end with .prefetch(tf.data.AUTOTUNE)
        the tf.data service: the input work on other machines (...)
    """
    ops, top = _dataset_ops(dataset)
    if ops is None:  # a graph that cannot be serialized: every general fix
        ops, top = set(_FILE_READERS), {"MapDataset"}
    fixes = []
    python = bool(ops & _PYTHON_OPS)
    if python:
        fixes.append("write the tf.py_function/numpy_function in TensorFlow ops (Python "
                     "runs one call at a time, holding the GIL)")
    if ops & _FILE_READERS and "CacheDatasetV2" not in ops:
        fixes.append("cache after decoding (fw.data.tfrecord_ds(..., cache=True), or "
                     ".cache() after the parsing map)")
    if "MapDataset" in top and "ParallelMapDatasetV2" not in top:
        fixes.append("more parallel maps (num_parallel_calls=tf.data.AUTOTUNE; "
                     "fw.transform augmentations after batching)")
    if ops & _FILE_READERS and not any(op.startswith("ParallelInterleave") for op in ops):
        fixes.append("more parallel reads (num_parallel_reads=tf.data.AUTOTUNE, several "
                     "files)")
    if "PrefetchDataset" not in top:
        fixes.append("end with .prefetch(tf.data.AUTOTUNE)")
    if any(op.startswith("DataServiceDataset") for op in ops):
        fixes.append("more tf.data service workers")
    elif not python:  # service workers are other processes: they cannot run Python
        fixes.append("the tf.data service: the input work on other machines "
                     "(fw.data.via_data_service, or tfrecord_ds(..., data_service=...))")
    return tuple(fixes)


def _graph(dataset: tf.data.Dataset) -> Any:
    """The `GraphDef` of `dataset` (what the tf.data service sends), or None."""
    try:
        return _tf_internals.dataset_graph(dataset)
    except (tf.errors.OpError, ValueError, TypeError) as err:
        logger.info("fenwicks: cannot read the input pipeline's graph (%s)", err)
        return None


def _dataset_ops(dataset: tf.data.Dataset) -> tuple[set | None, set | None]:
    """All op types of the dataset's graph, and those of its top-level chain."""
    graph = _graph(dataset)
    if graph is None:
        return None, None
    top = {node.op for node in graph.node}
    return top | {node.op for f in graph.library.function for node in f.node_def}, top


def _file_caches(dataset: tf.data.Dataset) -> list[str]:
    """The file name prefixes of the ``.cache(filename)`` steps of `dataset`."""
    graph = _graph(dataset)
    if graph is None:
        return []
    nodes = {node.name: node for node in graph.node}
    names = []
    for node in graph.node:
        name = node.input[1].split(":")[0] if node.op == "CacheDatasetV2" else None
        value = nodes[name].attr["value"].tensor.string_val if name in nodes else []
        names += [v.decode() for v in value if v]  # b"": a cache in memory
    return names


def _check_no_cache_being_written(dataset: tf.data.Dataset) -> None:
    """Raises if a file cache of `dataset` is being written (by the training input).

    tf.data lets one iterator write a file cache, and a second one that tries is refused
    and, when destroyed, deletes the partial cache files under the first one, which then
    fails. Reading a finished cache is fine.
    """
    for prefix in _file_caches(dataset):
        if tf.io.gfile.glob(f"{prefix}_*.lockfile"):
            raise ValueError(
                f"the input_fn's file cache {prefix!r} is being written by another "
                "iterator, the training input's, and tf.data allows one writer: a cache is "
                "complete after one whole pass (with augmented_epochs=K, K epochs and a "
                "batch). Call check_input once training has passed it, or check an "
                "input_fn with cache=True (in memory)")


def time_input(input_fn: inputs.InputFn, config: EstimatorConfig, accelerator: accel.Accelerator,
               num_batches: int, warmup_batches: int
               ) -> tuple[float, float, tf.data.Dataset]:
    """``(examples/s, seconds, the pipeline)`` of `input_fn` alone, as training reads it.

    The rate counts every replica's batch of each step, as training's examples/s do; on
    several workers, this host's batches scaled to the cluster (hosts alike).
    """
    # The pipelines train reads: the engine's InputManager builds and checks them. One is
    # probed first (as train checks its first batch), and read for the advice, before any
    # iterator exists.
    manager = engines.current().InputManager(config, accelerator)
    probe = manager.probe(input_fn, "train").dataset
    _check_no_cache_being_written(probe)
    iterator = manager.train_iterator(input_fn, start_step=0)
    drain, hosts = manager.read_steps, manager.num_hosts
    try:
        # At least one step: the drain loop compiles on it, and compiling is not reading.
        drain(iterator, max(warmup_batches, 1))
        start = time.perf_counter()
        examples = drain(iterator, num_batches)
        seconds = time.perf_counter() - start
    except (tf.errors.OutOfRangeError, InputExhaustedError) as err:
        raise ValueError(
            f"the training input ran out of data within {warmup_batches + num_batches} "
            "steps; end the input_fn's dataset with .repeat(), or lower num_batches")from err
    finally:
        # Let go of the iterator now, not at interpreter exit (release discards it).
        del iterator
        manager.release()
    examples *= hosts
    return examples / max(seconds, 1e-9), seconds, probe


def check_input(input_fn: inputs.InputFn, config: EstimatorConfig, accelerator: accel.Accelerator,
                train_loops: Sequence[tuple[int, float]], num_batches: int = 100,
                warmup_batches: int = 10) -> InputVerdict:
    """Times `input_fn` alone and judges it against the last training rate.

    Args:
        input_fn: the training ``params -> tf.data.Dataset``, as given to `train`.
        config: the estimator's `EstimatorConfig` (batch size, seed, precision).
        accelerator: the `fw.accel.Accelerator` training runs on.
        train_loops: ``(step, examples/s)`` of each compiled loop of the last `train`
            call (`History.examples_per_sec`); empty if none.
        num_batches: steps to time (one batch per replica each). Defaults to 100.
        warmup_batches: steps read first, untimed (at least one is: the timing loop
            compiles on it). Defaults to 10.

    Returns:
        An `InputVerdict`.

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.options import EstimatorConfig
        >>> config = EstimatorConfig(steps_per_epoch=4, work_dir=tempfile.mkdtemp(),
        ...                          train_batch_size=8, eval_batch_size=4,
        ...                          predict_batch_size=4, steps_per_loop=2,
        ...                          precision='float32', num_replicas=1, verbose=False)
        >>> X = np.ones((16, 3), 'float32')
        >>> y = X.sum(1, keepdims=True)   # 3: a zero model's squared error is 9
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> verdict = check_input(train_fn, config, fw.accel.current(),
        ...                       [(2, 300.0), (4, 3000.0)], num_batches=10)
        >>> verdict.train_examples_per_sec, verdict.num_batches   # the first loop left out
        (3000.0, 10)
        >>> print(verdict)
        input delivers ... ex/s, training consumed 3,000 ex/s (...x): ...
    """
    num_batches = positive_int("num_batches", num_batches, 100)
    if (isinstance(warmup_batches, bool) or not isinstance(warmup_batches, int)
            or warmup_batches < 0):
        raise ValueError(f"warmup_batches={warmup_batches!r} must be an integer >= 0, "
                         "e.g. warmup_batches=10")
    input_rate, seconds, dataset = time_input(input_fn, config, accelerator, num_batches,
                                              warmup_batches)
    train_rate = training_rate(train_loops)
    ratio, verdict = judge(input_rate, train_rate)
    fixes = advice(dataset) if verdict in (INPUT_BOUND, CLOSE) else ()
    return InputVerdict(input_rate, train_rate, ratio, verdict, fixes, num_batches,
                        seconds)
