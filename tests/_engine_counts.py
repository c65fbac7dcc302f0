"""Process helper of tests/test_engine_counts.py: one process of a two-process run that
records what the shared code computed from the engine's replica and process counts.

    python -m tests._engine_counts WORK_DIR [PORT NUM_PROCESSES PROCESS_ID]

On the jax engine (``KERAS_BACKEND=jax``, 4 host devices) the process joins the others
with ``jax.distributed.initialize`` on loopback (PORT, NUM_PROCESSES, PROCESS_ID); on the
tf engine the cluster comes from ``TF_CONFIG`` (`MultiWorkerMirroredStrategy`). It trains
a small classifier for 2 steps, evaluates it on `NUM_EVAL` examples, runs `find_lr` for
`LR_STEPS` steps and prints one JSON line: the params each input_fn was called with, the
per-replica batches the LR finder's pipeline produced, the evaluation's example count and
the training batch size recorded in the work_dir's run record.
"""

from __future__ import annotations

import json
import sys

TRN_BS = 64  # global training batch
VAL_BS = 16  # global evaluation batch
LR_BS = 32  # global batch of find_lr
LR_STEPS = 6
NUM_EVAL = 101  # not a multiple of anything: the last batch is partial
FEATURES, CLASSES = 8, 3


def _context(params: dict) -> list[int] | None:
    context = params.get("input_context")
    if context is None:
        return None
    return [context.num_input_pipelines, context.input_pipeline_id,
            context.num_replicas_in_sync]


def _seen(params: dict) -> dict:
    return {"batch_size": params["batch_size"], "global_batch_size":
            params["global_batch_size"], "num_replicas": params["num_replicas"],
            "context": _context(params)}


def run(work_dir: str, port: str | None = None, num_processes: str = "1",
        process_id: str = "0") -> dict:
    if port is not None:
        import jax

        jax.distributed.initialize(f"127.0.0.1:{port}", int(num_processes), int(process_id),
                                   initialization_timeout=60, heartbeat_timeout_seconds=60,
                                   shutdown_timeout_seconds=60)
    import keras
    import numpy as np
    import tensorflow as tf

    import fenwicks as fw

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, 256).astype(np.int32)
    calls: dict[str, list] = {"train": [], "eval": [], "find_lr": []}
    produced: list[int] = []  # per-replica batches find_lr's pipeline(s) here produced

    def train_fn(params):
        calls["train"].append(_seen(params))
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        context = params["input_context"]
        if context is not None:
            ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        return ds.repeat().batch(params["batch_size"], drop_remainder=True)

    def eval_fn(params):
        calls["eval"].append(_seen(params))
        return tf.data.Dataset.from_tensor_slices((x[:NUM_EVAL], y[:NUM_EVAL])).batch(
            params["batch_size"])

    def lr_fn(params):
        calls["find_lr"].append(_seen(params))
        size = params["batch_size"]

        def batches():
            while True:
                produced.append(1)
                yield x[:size], y[:size]

        return tf.data.Dataset.from_generator(batches, output_signature=(
            tf.TensorSpec([size, FEATURES], tf.float32), tf.TensorSpec([size], tf.int32)))

    def model_func():
        return fw.train.get_clf_model_func(
            lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)]),
            fw.train.sgd_optimizer(lambda step: 0.01))

    acc = fw.accel.current()
    est = fw.train.get_tpu_estimator(2, model_func(), work_dir, trn_bs=TRN_BS, val_bs=VAL_BS,
                                     seed=1, verbose=False, steps_per_loop=2)
    est.train(train_fn, max_steps=2)
    result = est.evaluate(eval_fn)
    est.close()
    # The run record of the last checkpoint: the batch size its input position counts in.
    from fenwicks.train import run_format

    recorded = run_format.read_record(run_format.latest(work_dir))["train_batch_size"]
    sweep = fw.train.find_lr(model_func(), lr_fn, start_lr=1e-4, end_lr=1e-3,
                             num_steps=LR_STEPS, batch_size=LR_BS, verbose=False)
    return {"engine": acc.engine, "acc_replicas": acc.num_replicas,
            "config": [est.config.num_replicas, est.config.num_processes],
            "train": calls["train"], "eval": calls["eval"], "find_lr": calls["find_lr"],
            "lr_batches": len(produced), "lr_steps": len(sweep.lrs),
            "num_examples": result["num_examples"], "recorded_trn_bs": recorded}


if __name__ == "__main__":
    print(json.dumps(run(*sys.argv[1:])), flush=True)
