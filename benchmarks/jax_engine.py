"""The JAX engine measured, in one run: four ratios, each from child processes on the
same model, data and devices (the tutorial-1 network, `fw.models.mnist_net` at c=32, on
random 28x28 digit-shaped data, global batch 128, 8 simulated host devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` for JAX, ``FENWICKS_DEVICE=cpu:8``
for TensorFlow).

  engine/fit      JAX engine's training examples/s over Keras `fit` on the JAX backend
                  under ``keras.distribution.DataParallel``: the same network, optimizer
                  (Fenwicks' AdamW), loss, batch, input pipeline (`fw.data.numpy_ds`:
                  the same examples in the same order) and steps per compiled execution
                  (the estimator's steps_per_loop); target >= 1.0. Both run in one process,
                  taking turns, so a change in the machine's load falls on both; each is
                  also given per CPU second of the process (steadier under load). The
                  engine's loop time is split into the compiled block alone and what is
                  outside it (input, copies, dispatch).
    fit/fit       the first `fit` over a second, identical one taking the same turns:
                  how far two identical trainers move apart in one run, the noise an
                  engine/fit ratio is read against (information)
  exact/drop      exact evaluation (last partial batch padded and masked) over an
                  evaluation that drops it, examples/s (target >= 0.95)
  async/sync      seconds a save blocks training, asynchronous over synchronous orbax
                  writes (a wider net: c=128 on 8x8 inputs, batch 8, ~19 MB with Adam's slots;
                  target <= 0.2)
  jax/tf          JAX engine over TensorFlow engine training examples/s on this CPU
                  (information)

Speeds are medians over the compiled loops after the first (which compiles).

    python benchmarks/jax_engine.py
    python benchmarks/jax_engine.py --loops 4 --width 8    # quicker, noisier

The JAX children get the caller's ``XLA_FLAGS`` plus the device count: the tests' smoke
run (tests/test_benchmark_scripts.py) adds ``--xla_backend_optimization_level=0`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout
from benchmarks import _results  # noqa: E402

BATCH, STEPS_PER_LOOP, SHAPE, NUM_TRAIN = 128, 10, (28, 28, 1), 4096
WIDTH = 32  # mnist_net's c (--width)
SAVE_WIDTH = 128  # the saved net's c (--save-width): ~19 MB with Adam's slots
EVAL_N, EVAL_BS = 4000, 512  # 4000 = 7 * 512 + 416: the last batch is partial


def _env(engine: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("FENWICKS_DEVICE", None)
    if engine == "tf":
        return {**env, "KERAS_BACKEND": "tensorflow", "FENWICKS_DEVICE": "cpu:8"}
    # The caller's XLA_FLAGS are kept (the suite's smoke run turns LLVM's optimisation
    # off with them: the same programs, compiled several times faster).
    flags = os.environ.get("XLA_FLAGS", "").split()
    return {**env, "KERAS_BACKEND": "jax",
            "XLA_FLAGS": " ".join([*flags, "--xla_force_host_platform_device_count=8"])}


def _data(n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.random((n, *SHAPE), dtype=np.float32),
            rng.integers(0, 10, n).astype(np.int32))


def _model_func(width: int | None = None, shape: tuple[int, ...] = SHAPE):
    import fenwicks as fw

    width = WIDTH if width is None else width
    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=width, input_shape=shape),
        fw.train.adam_optimizer(1e-3, wd=1e-4))


class _Clocks:
    """Wall and CPU seconds (`time.process_time`: every thread of this process) of each
    measured interval; under load from other processes the CPU seconds vary less."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._began = (0.0, 0.0)

    def begin(self) -> None:
        self._began = (time.perf_counter(), time.process_time())

    def end(self) -> None:
        self.wall.append(time.perf_counter() - self._began[0])
        self.cpu.append(time.process_time() - self._began[1])


def _estimator(clocks: _Clocks, timings: list[dict]):
    """An estimator whose JAX trainer (the engine's own, made at the first `train`) is
    timed per loop. One per process: it replaces the engine's trainer factory."""
    import fenwicks as fw
    from fenwicks.train.jax import engine

    made_by_engine = engine.JaxEngine.trainer

    def make(config, state, watcher):
        made = made_by_engine(config, state, watcher)
        train = made.train

        def timed(batches, num_steps):
            clocks.begin()
            output = train(batches, num_steps)
            clocks.end()
            timings.append(made.last_timing)
            return output

        made.train = timed
        return made

    engine.JaxEngine.trainer = staticmethod(make)
    work_dir = tempfile.mkdtemp()
    # Synchronous saves: the save at the end of each `train` must not run on while the
    # next variant is timed.
    return fw.train.get_tpu_estimator(
        STEPS_PER_LOOP, _model_func(), work_dir, trn_bs=BATCH, seed=0, verbose=False,
        save_every_secs=None, async_checkpoints=False)


def _fit_model(clocks: _Clocks):
    """Keras `fit` on the JAX backend under DataParallel over every device: the same
    network, optimizer (Fenwicks' AdamW: Keras's Adam with decoupled decay), loss,
    batch and steps per compiled execution as the engine's; timed per execution.
    BatchNorm normalises each device's slice of the batch, as in the engine's step
    (`fw.layers.current_batch_replicas` reads the DataParallel mesh)."""
    import keras

    import fenwicks as fw

    class Timed(keras.callbacks.Callback):  # not async_safe: Keras waits for each call
        def on_train_batch_begin(self, batch, logs=None):
            clocks.begin()

        def on_train_batch_end(self, batch, logs=None):
            clocks.end()

    distribution = keras.distribution.DataParallel()
    with distribution.scope():
        keras.utils.set_random_seed(0)
        model = fw.models.mnist_net(c=WIDTH, input_shape=SHAPE)
        model.compile(fw.train.adam_optimizer(1e-3, wd=1e-4)(),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=STEPS_PER_LOOP)
    return model, distribution, [Timed()]


def _train_rates(loops: int) -> dict:
    """Training examples/s of the engine and of the two Keras fits, in one process,
    taking turns (rounds of a few loops of each), so a change in the machine's load falls
    on all three.
    Round 0 compiles and is not counted, nor is the first loop of any call (it starts or
    resumes the input)."""
    import fenwicks as fw

    x, y = _data(NUM_TRAIN)
    clocks = {name: _Clocks() for name in ("engine", "fit", "fit_again")}
    engine_timings: list[dict] = []
    est = _estimator(clocks["engine"], engine_timings)
    fits = {name: _fit_model(clocks[name]) for name in ("fit", "fit_again")}
    # The same pipeline on both sides: the engine calls the input_fn for per-replica
    # batches and joins R of them into each global batch; fit reads global batches of it,
    # so both train on the same examples in the same order (each epoch shuffled). Fit
    # used to read unshuffled slices (`from_tensor_slices(...).batch`): 0.07 to 0.14 ms
    # of CPU a batch cheaper than this shuffled gather, which the engine was given.
    dataset = fw.data.numpy_ds(x, y, BATCH, seed=0)

    def input_fn(p):
        return fw.data.numpy_ds(x, y, p["batch_size"], seed=0,
                                input_context=p["input_context"])

    rounds = max(2, loops // 3)
    per_call = max(2, loops // rounds)
    kept: dict[str, list[int]] = {name: [] for name in clocks}
    for round_ in range(rounds + 1):
        for name, clock in clocks.items():
            first = len(clock.wall)
            if name in fits:
                model, distribution, callbacks = fits[name]
                with distribution.scope():
                    model.fit(dataset, steps_per_epoch=per_call * STEPS_PER_LOOP, epochs=1,
                              verbose=0, callbacks=callbacks)
            else:
                est.train(input_fn, steps=per_call * STEPS_PER_LOOP)
            if round_:
                kept[name] += range(first + 1, len(clock.wall))
    out = {}
    for name, clock in clocks.items():
        wall = [clock.wall[i] for i in kept[name]]
        cpu = [clock.cpu[i] for i in kept[name]]
        out[name] = {"wall": STEPS_PER_LOOP * BATCH / statistics.median(wall),
                     "cpu": STEPS_PER_LOOP * BATCH / statistics.median(cpu),
                     "loops": len(wall)}
    counted = [engine_timings[i] for i in kept["engine"]]
    out["engine_timing"] = {key: statistics.median(t[key] for t in counted)
                            for key in counted[0]}
    out["engine_compiled"] = _compiled_block_secs(est, x, y)
    est.close()
    return out


def _compiled_block_secs(est, x, y) -> float:
    """Median seconds of the engine's compiled block of STEPS_PER_LOOP steps alone, on
    a block already on the devices: the loop's time minus this is the time spent
    outside the compiled call."""
    import jax
    import jax.numpy as jnp

    from fenwicks.train.jax import mesh
    from fenwicks.train.jax import trainer as jax_trainer

    made = est._controller._trainer  # noqa: SLF001 (a benchmark looks inside)
    length = made._block_steps  # noqa: SLF001
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
               for i in range(length)]
    block = mesh.put_batch(jax_trainer._stack(batches), leading=1)  # noqa: SLF001
    values, done, secs = made.state.values(), jnp.bool_(False), []
    for _ in range(3):
        began = time.perf_counter()
        values, done, losses, _ = made._block(values, done, block)  # noqa: SLF001
        jax.block_until_ready(losses)
        secs.append((time.perf_counter() - began) * STEPS_PER_LOOP / length)
    made.state.set_values(values)
    return statistics.median(secs)


def _tf_rate(loops: int) -> dict:
    """The TensorFlow engine's training examples/s (this process is on TensorFlow)."""
    import fenwicks as fw

    x, y = _data(NUM_TRAIN)
    with tempfile.TemporaryDirectory() as work_dir:
        est = fw.train.get_tpu_estimator(
            STEPS_PER_LOOP, _model_func(), work_dir, trn_bs=BATCH, seed=0, verbose=False,
            save_every_secs=None)
        est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=0,
                                             input_context=p["input_context"]),
                  steps=loops * STEPS_PER_LOOP)
        rate = statistics.median(r for _, r in est.history.examples_per_sec[1:])
        est.close()
    return {"wall": rate}


def _eval_rates(trials: int) -> dict[str, float]:
    """Exact evaluation vs one over the same data with the remainder dropped, taking
    turns; the first of each compiles and is not counted."""
    import fenwicks as fw

    x, y = _data(EVAL_N)
    with tempfile.TemporaryDirectory() as work_dir:
        est = fw.train.get_tpu_estimator(STEPS_PER_LOOP, _model_func(), work_dir,
                                         trn_bs=BATCH, val_bs=EVAL_BS, verbose=False)
        kept = EVAL_N // EVAL_BS * EVAL_BS
        inputs = {"exact": lambda p: fw.data.numpy_ds(x, y, p["batch_size"],
                                                      training=False),
                  "drop": lambda p: fw.data.numpy_ds(x[:kept], y[:kept], p["batch_size"],
                                                     training=False)}
        clocks = {name: _Clocks() for name in inputs}
        counts = {}
        for _ in range(trials + 1):
            for name, input_fn in inputs.items():
                clocks[name].begin()
                counts[name] = est.evaluate(input_fn)["num_examples"]
                clocks[name].end()
        est.close()
    return {f"{name}_{kind}": counts[name] / statistics.median(getattr(clock, kind)[1:])
            for name, clock in clocks.items() for kind in ("wall", "cpu")}


def _save_blocking(loops: int) -> dict[str, float]:
    """Median seconds `save` blocked training per save, sync and async (JAX engine)."""
    import fenwicks as fw
    from fenwicks.train import run_format

    blocked: list[float] = []
    save = run_format.RunCheckpointer.save  # the run format: both engines' checkpoints

    def timed(self, step, *, force=False):
        save(self, step, force=force)
        if self.last_blocked_secs is not None:  # None: nothing new to save
            blocked.append(self.last_blocked_secs)

    run_format.RunCheckpointer.save = timed
    # 8x8 inputs and one example per device: the checkpoint's size is the same and a
    # step costs ~200 times less (what is measured is the save, not the step).
    x, y = _data(NUM_TRAIN)
    x = x[:, :8, :8]
    out = {}
    for mode in ("sync", "async"):
        blocked.clear()
        with tempfile.TemporaryDirectory() as work_dir:
            est = fw.train.get_tpu_estimator(
                STEPS_PER_LOOP, _model_func(SAVE_WIDTH, (8, 8, 1)), work_dir, trn_bs=8,
                verbose=False,
                save_every_loops=1, save_every_secs=None, keep_checkpoints=2,
                async_checkpoints=mode == "async")
            est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=0),
                      steps=loops * STEPS_PER_LOOP)
            est.close()
        out[mode] = statistics.median(blocked[1:-1])  # not the first, nor the end's
    return out


def _child(what: str, loops: int) -> object:
    return {"train": lambda: _train_rates(loops), "tf": lambda: _tf_rate(loops),
            "eval": lambda: _eval_rates(max(3, loops // 2)),
            "save": lambda: _save_blocking(loops)}[what]()


def _run(what: str, engine: str, loops: int) -> object:
    proc = subprocess.run([sys.executable, __file__, "--child", what, "--loops", str(loops),
                           "--width", str(WIDTH), "--save-width", str(SAVE_WIDTH)],
                          env=_env(engine), capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{what} on {engine} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {what} on {engine}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    global WIDTH, SAVE_WIDTH
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=9)
    parser.add_argument("--width", type=int, default=WIDTH,
                        help="mnist_net's c (32: the tutorial's; smaller runs faster)")
    parser.add_argument("--save-width", type=int, default=SAVE_WIDTH,
                        help="c of the net whose saves are timed (128: ~19 MB)")
    parser.add_argument("--child")
    _results.add_option(parser)
    args = parser.parse_args()
    WIDTH, SAVE_WIDTH = args.width, args.save_width
    if args.child:
        print(json.dumps(_child(args.child, args.loops)))
        return
    saves, evals = _run("save", "jax", args.loops), _run("eval", "jax", args.loops)
    train, tf_rate = _run("train", "jax", args.loops), _run("tf", "tf", args.loops)
    engine, fit, fit_again = train["engine"], train["fit"], train["fit_again"]
    print(f"mnist_net c={WIDTH}, batch {BATCH}, 8 host devices, {STEPS_PER_LOOP} steps per "
          f"loop; {engine['loops']} loops of each counted; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'measure':<12}{'value':>34}{'ratio':>9}  target")
    exact_bound = (EVAL_N / -(-EVAL_N // EVAL_BS)) / EVAL_BS
    rows = [
        ("engine/fit", f"{engine['wall']:,.0f} vs {fit['wall']:,.0f} ex/s",
         engine["wall"] / fit["wall"], ">= 1.0"),
        ("  per CPU s", f"{engine['cpu']:,.0f} vs {fit['cpu']:,.0f} ex/s",
         engine["cpu"] / fit["cpu"], "(same, per CPU second)"),
        ("fit/fit", f"{fit['wall']:,.0f} vs {fit_again['wall']:,.0f} ex/s",
         fit["wall"] / fit_again["wall"], "info (two identical fits: the noise)"),
        ("exact/drop", f"{evals['exact_wall']:,.0f} vs {evals['drop_wall']:,.0f} ex/s",
         evals["exact_wall"] / evals["drop_wall"],
         f">= 0.95 (padding bounds it at {exact_bound:.3f})"),
        ("  per CPU s", f"{evals['exact_cpu']:,.0f} vs {evals['drop_cpu']:,.0f} ex/s",
         evals["exact_cpu"] / evals["drop_cpu"], "(same, per CPU second)"),
        ("async/sync", f"{saves['async'] * 1e3:.1f} vs {saves['sync'] * 1e3:.1f} ms",
         saves["async"] / saves["sync"], "<= 0.2"),
        ("jax/tf", f"{engine['wall']:,.0f} vs {tf_rate['wall']:,.0f} ex/s",
         engine["wall"] / tf_rate["wall"], "info"),
    ]
    for name, value, ratio, target in rows:
        print(f"{name:<12}{value:>34}{ratio:>9.2f}  {target}")
    if args.results:
        _results.write(__file__, f"the JAX engine: mnist_net c={WIDTH}, batch {BATCH}, 8 host "
                       "devices", [{"measure": name.strip(), "value": value,
                                    "ratio": round(ratio, 2), "target": target}
                                   for name, value, ratio, target in rows])
    timing, compiled = train["engine_timing"], train["engine_compiled"]
    print(f"engine loop, median s: {timing['total']:.3f} = the compiled block alone "
          f"{compiled:.3f} + outside it {timing['total'] - compiled:+.3f}; on the host: "
          f"input {timing['input']:.3f}, copy to devices {timing['transfer']:.3f}, "
          f"dispatch {timing['dispatch']:.3f}, waiting for the devices {timing['wait']:.3f}")


if __name__ == "__main__":
    main()
