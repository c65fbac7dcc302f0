"""The JAX engine measured, in one run: four ratios, each from child processes on the
same model, data and devices (the tutorial-1 network, `fw.models.mnist_net` at c=32, on
random 28x28 digit-shaped data, global batch 128, 8 simulated host devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` for JAX, ``FENWICKS_DEVICE=cpu:8``
for TensorFlow).

  engine/fit      JAX engine's training examples/s over Keras `fit` on the JAX backend
                  under ``keras.distribution.DataParallel`` (steps_per_execution = the
                  estimator's steps_per_loop, AdamW; target >= 1.0)
  block/step      blocks of steps in one ``lax.scan`` call over one jitted call per step
                  (how the engine's loop is built; information)
  exact/drop      exact evaluation (last partial batch padded and masked) over an
                  evaluation that drops it, examples/s (target >= 0.95)
  async/sync      seconds a save blocks training, asynchronous over synchronous orbax
                  writes (a wider net: c=128 on 8x8 inputs, batch 8, ~19 MB with Adam's slots;
                  target <= 0.2)
  jax/tf          JAX engine over TensorFlow engine training examples/s on this CPU
                  (information)

Speeds are medians over the compiled loops after the first (which compiles).

    python benchmarks/jax_engine.py
    python benchmarks/jax_engine.py --loops 6      # quicker, noisier
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
BATCH, STEPS_PER_LOOP, SHAPE, NUM_TRAIN = 128, 10, (28, 28, 1), 4096
EVAL_N, EVAL_BS = 4000, 512  # 4000 = 7 * 512 + 416: the last batch is partial


def _env(engine: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("FENWICKS_DEVICE", None)
    if engine == "tf":
        return {**env, "KERAS_BACKEND": "tensorflow", "FENWICKS_DEVICE": "cpu:8"}
    return {**env, "KERAS_BACKEND": "jax",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}


def _data(n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.random((n, *SHAPE), dtype=np.float32),
            rng.integers(0, 10, n).astype(np.int32))


def _model_func(width: int = 32, shape: tuple[int, ...] = SHAPE):
    import fenwicks as fw

    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=width, input_shape=shape),
        fw.train.adam_optimizer(1e-3, wd=1e-4))


def _median_rate(est, first: int) -> float:
    return statistics.median(r for _, r in est.history.examples_per_sec[first + 1:])


def _train_rate(loops: int, block_steps: int | None = None) -> float:
    """Estimator training examples/s (either engine: the environment chooses)."""
    import fenwicks as fw

    if block_steps is not None:  # the JAX trainer with another block length
        from fenwicks.train.jax import engine, trainer

        engine.JaxEngine.trainer = staticmethod(
            lambda strategy, config, state, stop: trainer.JaxTrainer(
                state, config.train_batch_size, config.steps_per_loop, stop, block_steps))
    x, y = _data(NUM_TRAIN)
    with tempfile.TemporaryDirectory() as work_dir:
        est = fw.train.get_tpu_estimator(
            STEPS_PER_LOOP, _model_func(), work_dir, trn_bs=BATCH, seed=0, verbose=False,
            save_every_secs=None)
        est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=0,
                                             input_context=p["input_context"]),
                  steps=loops * STEPS_PER_LOOP)
        rate = _median_rate(est, 0)
        est.close()
    return rate


def _fit_rate(loops: int) -> float:
    """Keras fit on the JAX backend, data parallel over every device."""
    import keras
    import tensorflow as tf

    keras.distribution.set_distribution(keras.distribution.DataParallel())
    import fenwicks as fw

    x, y = _data(NUM_TRAIN)
    keras.utils.set_random_seed(0)
    model = fw.models.mnist_net(c=32, input_shape=SHAPE)
    model.compile(keras.optimizers.AdamW(1e-3, weight_decay=1e-4),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=STEPS_PER_LOOP)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        BATCH, drop_remainder=True).prefetch(2)
    model.fit(dataset, steps_per_epoch=STEPS_PER_LOOP, epochs=1, verbose=0)  # compiles
    rates = []
    for _ in range(loops - 1):
        began = time.perf_counter()
        model.fit(dataset, steps_per_epoch=STEPS_PER_LOOP, epochs=1, verbose=0)
        rates.append(STEPS_PER_LOOP * BATCH / (time.perf_counter() - began))
    return statistics.median(rates)


def _eval_rates(trials: int) -> dict[str, float]:
    """Exact evaluation vs one over the same data with the remainder dropped."""
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
        times: dict[str, list[float]] = {"exact": [], "drop": []}
        for trial in range(trials + 1):
            for name, input_fn in inputs.items():
                began = time.perf_counter()
                count = est.evaluate(input_fn)["num_examples"]
                if trial:  # the first compiles
                    times[name].append(count / (time.perf_counter() - began))
        est.close()
    return {name: statistics.median(rates) for name, rates in times.items()}


def _save_blocking(loops: int) -> dict[str, float]:
    """Median seconds `save` blocked training per save, sync and async (JAX engine)."""
    import fenwicks as fw
    from fenwicks.train.jax import checkpoints

    blocked: list[float] = []
    save = checkpoints.OrbaxCheckpointer.save

    def timed(self, step, *, force=False):
        save(self, step, force=force)
        if self.last_blocked_secs is not None:  # None: nothing new to save
            blocked.append(self.last_blocked_secs)

    checkpoints.OrbaxCheckpointer.save = timed
    # 8x8 inputs and one example per device: the checkpoint's size is the same and a
    # step costs ~200 times less (what is measured is the save, not the step).
    x, y = _data(NUM_TRAIN)
    x = x[:, :8, :8]
    out = {}
    for mode in ("sync", "async"):
        blocked.clear()
        with tempfile.TemporaryDirectory() as work_dir:
            est = fw.train.get_tpu_estimator(
                STEPS_PER_LOOP, _model_func(128, (8, 8, 1)), work_dir, trn_bs=8,
                verbose=False,
                save_every_loops=1, save_every_secs=None, keep_checkpoints=2,
                async_checkpoints=mode == "async")
            est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=0),
                      steps=loops * STEPS_PER_LOOP)
            est.close()
        out[mode] = statistics.median(blocked[1:-1])  # not the first, nor the end's
    return out


def _child(what: str, loops: int) -> object:
    return {"train": lambda: _train_rate(loops), "fit": lambda: _fit_rate(loops),
            "step": lambda: _train_rate(loops, block_steps=1),
            "eval": lambda: _eval_rates(3), "save": lambda: _save_blocking(loops)}[what]()


def _run(what: str, engine: str, loops: int) -> object:
    proc = subprocess.run([sys.executable, __file__, "--child", what, "--loops", str(loops)],
                          env=_env(engine), capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{what} on {engine} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {what} on {engine}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.loops)))
        return
    saves, evals = _run("save", "jax", args.loops), _run("eval", "jax", args.loops)
    engine_rate, fit_rate = _run("train", "jax", args.loops), _run("fit", "jax", args.loops)
    tf_rate, step_rate = _run("train", "tf", args.loops), _run("step", "jax", args.loops)
    print(f"mnist_net c=32, batch {BATCH}, 8 host devices, {STEPS_PER_LOOP} steps per loop")
    print(f"{'measure':<12}{'value':>34}{'ratio':>9}  target")
    rows = [
        ("engine/fit", f"{engine_rate:,.0f} vs {fit_rate:,.0f} ex/s", engine_rate / fit_rate,
         ">= 1.0"),
        ("block/step", f"{engine_rate:,.0f} vs {step_rate:,.0f} ex/s",
         engine_rate / step_rate, "info"),
        ("exact/drop", f"{evals['exact']:,.0f} vs {evals['drop']:,.0f} ex/s",
         evals["exact"] / evals["drop"], ">= 0.95"),
        ("async/sync", f"{saves['async'] * 1e3:.1f} vs {saves['sync'] * 1e3:.1f} ms",
         saves["async"] / saves["sync"], "<= 0.2"),
        ("jax/tf", f"{engine_rate:,.0f} vs {tf_rate:,.0f} ex/s", engine_rate / tf_rate,
         "info"),
    ]
    for name, value, ratio, target in rows:
        print(f"{name:<12}{value:>34}{ratio:>9.2f}  {target}")


if __name__ == "__main__":
    main()
