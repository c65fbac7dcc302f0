"""params['batch_size'] per mode and input placement (issue 50, item 5), in a process of
its own: ``python -m tests._tf1_batch_sizes <model_dir>`` under FENWICKS_DEVICE=cpu:N
prints, per placement, the batch size each mode's input_fn was given, the weights after
one step of gradient descent and the number of examples evaluated and predicted; a
refused placement prints its error. Global batches: train 64, eval 16, predict 16.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw

v1 = tf.compat.v1
IPC = fw.train.InputPipelineConfig
PLACEMENTS = {"true": (True, None, True), "false": (False, None, True),
              "per_host_v1": (IPC.PER_HOST_V1, None, True),
              "per_shard_v1": (IPC.PER_SHARD_V1, None, True),
              "per_host_v2": (IPC.PER_HOST_V2, None, True),
              "broadcast": (IPC.BROADCAST, None, True),
              "v2_sliced_eval": (IPC.PER_HOST_V2, IPC.SLICED, True),
              "v2_use_tpu_false": (IPC.PER_HOST_V2, None, False)}


def data():
    rng = np.random.default_rng(5)
    return (rng.normal(size=(64, 3)).astype(np.float32),
            rng.normal(size=(64, 1)).astype(np.float32))


def model_fn(features, labels, mode, params):
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(features)
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=outputs)
    loss = v1.losses.mean_squared_error(labels, outputs)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_or_create_global_step())
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def run(name: str, model_dir: str) -> dict:
    placement, eval_config, use_tpu = PLACEMENTS[name]
    x, y = data()
    seen: dict[str, list[int]] = {"train": [], "eval": [], "predict": []}

    def input_fn_of(mode, rows, labelled=True):
        def input_fn(params):
            seen[mode].append(params["batch_size"])
            parts = (x[:rows], y[:rows]) if labelled else x[:rows]
            dataset = tf.data.Dataset.from_tensor_slices(parts)
            return dataset.batch(params["batch_size"], drop_remainder=True).repeat(
                1 if mode != "train" else None)
        return input_fn

    try:
        config = fw.train.RunConfig(tpu_config=fw.train.TPUConfig(
            1, per_host_input_for_training=placement,
            eval_training_input_configuration=eval_config))
        est = fw.train.TPUEstimator(model_fn, model_dir=model_dir, config=config,
                                    use_tpu=use_tpu, train_batch_size=64, eval_batch_size=16,
                                    predict_batch_size=16, verbose=False)
    except ValueError as err:
        return {"error": str(err)}
    est.train(input_fn_of("train", 64), max_steps=1)
    evaluated = est.evaluate(input_fn_of("eval", 32))["num_examples"]
    predicted = np.array(list(est.predict(input_fn_of("predict", 32, labelled=False))))
    est.close()
    return {"seen": {mode: sorted(set(sizes)) for mode, sizes in seen.items()},
            "evaluated": int(evaluated), "predictions": predicted.ravel().tolist()}


def main(root: str) -> None:
    out = {"replicas": fw.accel.current().num_replicas}
    for name in PLACEMENTS:
        out[name] = run(name, os.path.join(root, name))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
