"""Subprocess: train, evaluate and predict on a faked TPU of N chips (``python -m
tests._tpu_fake N``); prints one JSON line of what happened.

`fw.accel` takes its TPU code path (libtpu present, ``tpu_strategy('local')`` answers);
the strategy it gets is a real one over CPUs standing in for `TPUStrategy`:
`OneDeviceStrategy` for one chip, `MirroredStrategy` over N logical CPUs otherwise. Kind,
precision and the default of jit_compile are decided by Fenwicks as on a TPU. XLA runs on
one replica; over logical CPU devices it cannot reach the variables, so N > 1 trains
without it.
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np


def _layers(layer):
    """Every layer inside `layer`, depth first, through public attributes: a model's
    ``layers`` and a block's layer attributes (Keras 3 has no public recursive walk)."""
    import keras

    children = layer.layers if isinstance(layer, keras.Model) else [
        v for v in vars(layer).values() if isinstance(v, keras.layers.Layer)]
    for child in children:
        yield child
        yield from _layers(child)


def main(replicas: int) -> None:
    import keras
    import tensorflow as tf

    import fenwicks as fw
    from fenwicks.train.tf import devices

    class Resolver:
        def cluster_spec(self):
            return tf.train.ClusterSpec({})

    class FakeTPUProbe(devices.TFProbe):
        def has_libtpu(self) -> bool:
            return True

        def tpu_strategy(self, tpu: str):
            assert tpu == "local", tpu
            if replicas == 1:
                return Resolver(), tf.distribute.OneDeviceStrategy("/cpu:0")
            return Resolver(), devices.TFProbe().cpu_strategy(replicas)

    devices.TFProbe = FakeTPUProbe
    acc = fw.accel.current()
    rng = np.random.default_rng(0)
    x = rng.random((96, 8, 8, 1), dtype=np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype("int32")
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(n_classes=2, c=4, input_shape=(8, 8, 1)),
        fw.train.adam_optimizer(lambda step: 1e-3))
    with tempfile.TemporaryDirectory() as work_dir:
        est = fw.train.get_tpu_estimator(
            3, model_func, work_dir, trn_bs=8 * replicas, val_bs=2 * replicas,
            jit_compile=None if replicas == 1 else False, verbose=False)
        with est:
            est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=1), max_steps=6)
            result = est.evaluate(
                lambda p: fw.data.numpy_ds(x[:37], y[:37], p["batch_size"], training=False))
            probs = est.predict(
                lambda p: fw.data.numpy_ds(x[:37], None, p["batch_size"], training=False))
            # The first convolution: the head computes its softmax in float32 on purpose.
            conv = next(layer for layer in _layers(est.model)
                        if isinstance(layer, keras.layers.Conv2D))
            print(json.dumps({
                "kind": acc.kind, "replicas": acc.num_replicas, "precision": acc.precision,
                "jit_compile": est.config.jit_compile, "global_step": est.global_step,
                "losses_finite": bool(np.isfinite(result["loss"])),
                "compute_dtype": conv.dtype_policy.compute_dtype,
                "variable_dtype": conv.dtype_policy.variable_dtype,
                "eval_count": float(result["num_examples"]),
                "predictions": int(len(probs)),
                "rows_sum_to_1": bool(np.allclose(np.asarray(probs).sum(axis=1), 1, atol=1e-2))}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
