"""The blocks on a backend: `python -m tests._blocks_jax IN.npz OUT.npz` under
``KERAS_BACKEND=jax`` (tests/test_blocks_jax.py).

The test process (TensorFlow) writes the inputs and the models' weights; this process
builds the same models on its backend, loads the weights in order and writes what the
blocks compute, each the way an engine computes it: inside ``jax.jit``, the model through
`stateless_call`, the optimizers through `stateless_apply`. The test compares the results
with TensorFlow's and with numpy references. Builders shared by both sides are here.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import fenwicks as fw

BATCH = 8  # examples per model call: two ghost groups of 4, or two replicas of 4


def mnist(bn: Any = "replica") -> keras.Model:
    """ConvBN, ConvBlk, GlobalPools2D, Classifier (tutorial 1's net, narrow)."""
    return fw.models.mnist_net(n_classes=5, c=4, input_shape=(12, 12, 1), bn=bn)


def resnet9_ghost() -> keras.Model:
    """ConvResBlk and ghost BatchNorm in groups of 4 (DavidNet's layout, narrow)."""
    return fw.models.resnet9(n_classes=5, c=4, input_shape=(16, 16, 3), bn=4)


def resnet_sync() -> keras.Model:
    """ResBlock with projections, BatchNorm synchronized across replicas."""
    return fw.models.resnet((1, 1), n_classes=5, c=4, input_shape=(16, 16, 3), bn="sync")


def dense() -> keras.Model:
    """DenseBN (replica and ghost), Classifier with a bias and a weight."""
    return fw.Sequential([keras.Input((6,)), fw.layers.DenseBN(5),
                          fw.layers.DenseBN(4, bn=2),
                          fw.layers.Classifier(3, use_bias=True, weight=0.5)])


# name -> (builder, input shape); "replica2" is mnist on 2 replicas' batch (see main).
MODELS: dict[str, tuple[Callable[[], keras.Model], tuple[int, ...]]] = {
    "mnist": (mnist, (12, 12, 1)), "resnet9": (resnet9_ghost, (16, 16, 3)),
    "resnet": (resnet_sync, (16, 16, 3)), "dense": (dense, (6,)),
    "replica2": (mnist, (12, 12, 1)),
}


def schedules() -> dict[str, Any]:
    """The schedules checked at `STEPS` (test_blocks_jax.py has their formulas)."""
    train = fw.train
    return {
        "piecewise": train.piecewise_linear([0, 5, 24], [0, 0.4, 0]),
        "one_cycle": train.one_cycle_lr(0.4, 40, 10, train.linear_decay()),
        "cosine": train.cosine_decay(1.0, 20),
        "exp_warmup": train.exp_decay_lr(0.01, 10, base_lr=1e-4, warmup_steps=5),
        "momentum": train.one_cycle_momentum(40, 10),
        "scaled": train.linear_decay(0.4, 10) / 4,
    }


STEPS = np.array([0, 3, 5, 7, 10, 15, 24, 30, 50], np.int32)
# Optimizers: a Dense(2) on 3 features, two steps with these gradients (test_blocks_jax).
OPTIMIZERS = {
    "sgd": lambda: fw.train.sgd_optimizer(fw.train.linear_decay(0.1, 5), mom=0.9, wd=0.1,
                                          nesterov=True)(),
    "sgd_clip": lambda: fw.train.sgd_optimizer(0.1, mom=0.5, wd=0.0, nesterov=False,
                                               clip_norm=0.5)(),
    "adamw": lambda: fw.train.adam_optimizer(fw.train.linear_decay(0.1, 5), wd=0.1,
                                             exclude_from_wd=["bias"])(),
}


def _model_outputs(name: str, model: keras.Model, x: Any) -> dict[str, np.ndarray]:
    """Inference outputs, training outputs and the non-trainable variables after one
    training call, through ``jax.jit(model.stateless_call)`` as an engine calls it."""
    import jax

    def call(trainable: Any, non_trainable: Any, x: Any, training: bool) -> Any:
        if name == "replica2":  # the global batch of 2 replicas: statistics per replica
            with fw.layers.batch_replicas(2):
                return model.stateless_call(trainable, non_trainable, x, training=training)
        return model.stateless_call(trainable, non_trainable, x, training=training)

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    compiled = jax.jit(call, static_argnums=3)
    eval_out, _ = compiled(trainable, non_trainable, x, False)
    train_out, after = compiled(trainable, non_trainable, x, True)
    result = {f"{name}/eval": np.asarray(eval_out), f"{name}/train": np.asarray(train_out)}
    for i, value in enumerate(after):
        result[f"{name}/moving/{i}"] = np.asarray(value)
    return result


def _sharded_outputs(data: Any) -> dict[str, np.ndarray]:
    """The training call of "replica2" and "resnet" on a batch sharded over 2 devices
    under `keras.distribution.DataParallel`, as the JAX engine and Keras's ``fit`` run it:
    'replica' then takes its replica count from the distribution, and 'sync' is the
    whole batch's statistics. Needs 2 devices (XLA_FLAGS in the test's environment)."""
    import jax

    devices = jax.devices()[:2]
    distribution = keras.distribution.DataParallel(devices=devices)
    sharding = jax.sharding.NamedSharding(distribution.device_mesh.backend_mesh,
                                          jax.sharding.PartitionSpec("batch"))
    result = {}
    keras.distribution.set_distribution(distribution)
    try:
        for name in ("replica2", "resnet"):
            model = MODELS[name][0]()  # variables replicated over the mesh
            model.set_weights([data[f"{name}/weights/{i}"]
                               for i in range(len(model.weights))])
            x = jax.device_put(data[f"{name}/x"], sharding)
            out, _ = jax.jit(functools.partial(model.stateless_call, training=True))(
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables], x)
            result[f"{name}/sharded_train"] = np.asarray(out)
            result[f"{name}/sharded_devices"] = np.asarray(len(x.sharding.device_set))
    finally:
        keras.distribution.set_distribution(None)
    return result


def _model_funcs(data: Any) -> dict[str, np.ndarray]:
    """ModelSpec.example_values and predict_fn under jax.jit, for clf and reg."""
    import jax

    opt_func = fw.train.sgd_optimizer(0.1)
    clf = fw.train.get_clf_model_func(dense, opt_func)({})
    reg = fw.train.get_reg_model_func(dense, opt_func)({})
    result = {}
    for name, spec, labels in (("clf", clf, data["clf/labels"]),
                               ("reg", reg, data["reg/labels"])):
        values = jax.jit(spec.example_values)(labels, data["logits"])
        result.update({f"{name}/{k}": np.asarray(v) for k, v in values.items()})
    result["clf/predict"] = np.asarray(jax.jit(clf.predict_fn)(data["logits"]))
    return result


def _optimizers(data: Any) -> dict[str, np.ndarray]:
    """Two steps of each optimizer through jax.jit(optimizer.stateless_apply)."""
    import jax

    result = {}
    for name, make in OPTIMIZERS.items():
        layer = keras.layers.Dense(2, name="dense")
        layer.build((None, 3))
        layer.kernel.assign(data["opt/w0"])
        layer.bias.assign(data["opt/b0"])
        optimizer = make()
        optimizer.build(layer.trainable_variables)
        trainable = [v.value for v in layer.trainable_variables]
        slots = [v.value for v in optimizer.variables]
        step = jax.jit(optimizer.stateless_apply)
        for t in range(2):
            grads = [data[f"opt/gw{t}"], data[f"opt/gb{t}"]]
            trainable, slots = step(slots, grads, trainable)
        result[f"{name}/w"], result[f"{name}/b"] = map(np.asarray, trainable)
        counter = next(i for i, v in enumerate(optimizer.variables)
                       if v is optimizer.iterations)
        result[f"{name}/iterations"] = np.asarray(slots[counter])
    return result


def _schedules() -> dict[str, np.ndarray]:
    import jax

    steps = jax.numpy.asarray(STEPS)
    return {f"schedule/{name}": np.asarray(jax.jit(schedule)(steps))
            for name, schedule in schedules().items()}


def main(in_path: str, out_path: str) -> None:
    data = np.load(in_path)
    result: dict[str, np.ndarray] = {}
    for name, (build, _) in MODELS.items():
        model = build()
        count = len(model.weights)
        model.set_weights([data[f"{name}/weights/{i}"] for i in range(count)])
        result.update(_model_outputs(name, model, data[f"{name}/x"]))
    result.update(_sharded_outputs(data))
    result.update(_model_funcs(data))
    result.update(_optimizers(data))
    result.update(_schedules())
    np.savez(out_path, **result)
    print(json.dumps({"backend": keras.backend.backend(), "arrays": len(result)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
