"""Process helper of tests/test_jax_multihost.py: one process of a JAX-engine run on
``NUM_PROCESSES`` processes (``jax.distributed.initialize`` on loopback; one process
means a plain single-host run), training the product's tutorial-1 network
(`fw.models.mnist_net`, narrow) on scikit-learn's digits, then evaluating it exactly.

    python -m tests._jax_multihost PORT NUM_PROCESSES PROCESS_ID WORK_DIR MAX_STEPS
        [--wrong-size-first] [--sigterm-last-at=STEP]

Prints one JSON line: the step it started from, its global step, losses, the
evaluation (and, on a single process, the predicted probabilities and labels), and
(process 0) the final weights saved to ``WORK_DIR/weights-<step>.npz``.
With ``--wrong-size-first`` it first calls `train` with an input_fn whose batches are
one example too large on the last process, and records the error each process raised.
With ``--sigterm-last-at=STEP`` the last process sends itself SIGTERM once training
reached STEP (from a callback, at a loop's end, as a preempted host gets it), and each
process records the `fw.train.Preempted` it stopped with.
"""

from __future__ import annotations

import json
import os
import signal
import sys

SEED = 5
PER_REPLICA = 8  # examples per replica per step; 8 replicas: a global batch of 64
EPOCHS_OF_ORDER = 3  # the fixed example order spans this many epochs (enough steps)


def _initialize(port: str, num_processes: int, process_id: int) -> None:
    """Joins the run's processes, before anything touches a JAX device (fenwicks does
    not at import). Timeouts shorter than the defaults (100 s, 300 s): a failing test ends sooner,
    but long enough for a machine loaded by other tests."""
    if num_processes == 1:
        return
    import jax

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id,
                               initialization_timeout=60, heartbeat_timeout_seconds=60,
                               shutdown_timeout_seconds=60)


def model_func():
    import fenwicks as fw

    lr_func = fw.train.exp_decay_lr(init_lr=0.05, decay_steps=20, base_lr=1e-3)
    opt_func = fw.train.sgd_optimizer(lr_func, mom=0.9, wd=5e-4)
    # Ghost BatchNorm (fixed groups of 8 examples, one replica's batch): the same
    # statistics however the global batch is split over processes.
    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=8, input_shape=(8, 8, 1), bn=PER_REPLICA), opt_func)


def sharded_input(x, y):
    """An input_fn over one fixed order of the examples (seeded permutations, epoch after
    epoch) cut into per-replica batches. Given ``InputContext(P, p, R)`` it yields only
    process p's batches: at step s, batches ``s * R + p * L .. + L - 1`` (L = R / P), the
    ones a single process would hand to the replicas p holds. So one process or several
    train on the same global batches."""
    import numpy as np
    import tensorflow as tf

    order = np.concatenate([np.random.RandomState(SEED + epoch).permutation(len(x))
                            for epoch in range(EPOCHS_OF_ORDER)])

    def input_fn(params):
        size, context = params["batch_size"], params["input_context"]
        batches = order[:len(order) // size * size].reshape(-1, size)
        processes, index = (1, 0) if context is None else (
            context.num_input_pipelines, context.input_pipeline_id)
        local = params["num_replicas"] // processes
        mine = (np.arange(len(batches)) % params["num_replicas"]) // local == index
        rows = batches[mine]
        return tf.data.Dataset.from_tensor_slices((x[rows], y[rows]))

    return input_fn


def wrong_size_on_last_process(x, y, num_processes):
    """As `sharded_input`, but the last process's batches hold one example too many."""
    import tensorflow as tf

    def input_fn(params):
        context = params["input_context"]
        last = context is not None and context.input_pipeline_id == num_processes - 1
        size = params["batch_size"] + (1 if last else 0)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(size, drop_remainder=True)

    return input_fn


def _sigterm_last_at(est, num_processes: int) -> list:
    """The callback of ``--sigterm-last-at=STEP`` on the last process, else none."""
    import jax
    import keras

    flag = [a for a in sys.argv if a.startswith("--sigterm-last-at=")]
    if not flag or jax.process_index() != num_processes - 1:
        return []
    at = int(flag[0].split("=")[1])

    class SigtermAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if est.global_step >= at:
                os.kill(os.getpid(), signal.SIGTERM)

    return [SigtermAt()]


def run(port: str, num_processes: str, process_id: str, work_dir: str, max_steps: str
        ) -> dict:
    _initialize(port, int(num_processes), int(process_id))
    import jax
    import numpy as np

    import fenwicks as fw
    from fenwicks import demo

    x_train, y_train, x_test, y_test = demo.load_digits()
    est = fw.train.get_tpu_estimator(
        10, model_func(), work_dir, trn_bs=PER_REPLICA * 8, val_bs=56, seed=SEED,
        verbose=False, steps_per_loop=3, save_every_loops=1, save_every_secs=None)
    out: dict = {"process": jax.process_index(), "processes": jax.process_count(),
                 "devices": jax.device_count(), "local_devices": jax.local_device_count()}
    if "--wrong-size-first" in sys.argv:
        try:
            est.train(wrong_size_on_last_process(x_train, y_train, int(num_processes)),
                      max_steps=int(max_steps))
        except ValueError as err:
            out["wrong_size_error"] = str(err)
    try:
        est.train(sharded_input(x_train, y_train), max_steps=int(max_steps),
                  callbacks=_sigterm_last_at(est, int(num_processes)))
    except fw.train.Preempted as stop:
        est.close()
        return {**out, "preempted_at": stop.step, "global_step": est.global_step,
                "start_step": est.history.steps[0] - 1,
                "losses": [float(v) for v in est.history.losses]}
    result = est.evaluate(lambda p: fw.data.numpy_ds(x_test, y_test, p["batch_size"],
                                                     training=False))
    def predict_fn(params):
        return fw.data.numpy_ds(x_test, None, params["batch_size"], training=False)

    if jax.process_count() == 1:  # the reference's predictions
        out["probabilities"] = est.predict(predict_fn).tolist()
        out["labels"] = y_test.tolist()
    else:
        try:
            est.predict(predict_fn)
        except ValueError as err:
            out["predict_error"] = str(err)
    if jax.process_index() == 0:
        weights = [np.asarray(v.value) for v in est.model.variables]
        np.savez(f"{work_dir}/weights-{est.global_step}.npz", *weights)
    est.close()
    return {**out, "start_step": est.history.steps[0] - 1, "global_step": est.global_step,
            "losses": [float(v) for v in est.history.losses], "eval": result}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    print(json.dumps(run(*args)), flush=True)
