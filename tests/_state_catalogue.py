"""Every public model and layer of Fenwicks, found by introspection, each with a tiny task.

`tests/test_state.py` runs this module in two processes, as a user meets a resume:

    python -m tests._state_catalogue train WORK_ROOT [NAME...]  # train each (or the named)
    python -m tests._state_catalogue check WORK_ROOT [NAME...]  # reopen the same work_dirs
    python -m tests._state_catalogue user WORK_DIR STEPS   # a user's list-held layer

A model or layer added to `fw.models.__all__` or `fw.layers.__all__` later is covered
without editing this file, unless its constructor needs an argument none of `_REQUIRED`
supplies: then `entries()` raises and the test names the argument to add.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import fenwicks as fw

NUM_CLASSES = 3
IMAGE_SHAPE = (8, 8, 3)  # what layers are fed
# Values for constructor arguments without a default, by name.
_REQUIRED: dict[str, Any] = {"c": 4, "n_classes": NUM_CLASSES, "input_shape": (6, 3)}
# Narrow versions of arguments that have a default; dropout on wherever it exists, so
# the random state of Dropout is part of what must survive.
_NARROW: dict[str, Any] = {"c": 4, "units": 4, "n_classes": NUM_CLASSES, "blocks": (1, 1),
                           "drop_rate": 0.25}
TRAIN_STEPS = 6


def _kwargs(func: Callable, where: str) -> dict[str, Any]:
    kwargs = {}
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if param.default is param.empty:
            if name not in _REQUIRED:
                raise KeyError(f"{where} needs argument {name!r}: add a small value for it "
                               "to _REQUIRED in tests/_state_catalogue.py")
            kwargs[name] = _REQUIRED[name]
        elif name in _NARROW:
            kwargs[name] = _NARROW[name]
    return kwargs


def _is_layer_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, keras.layers.Layer)


def entries() -> dict[str, Callable[[], keras.Model]]:
    """``'module.Name'`` -> a function building a small model around that model or layer."""
    found: dict[str, Callable[[], keras.Model]] = {}
    for module in (fw.models, fw.layers):
        short = module.__name__.split(".")[-1]
        for name in module.__all__:
            obj = getattr(module, name)
            where = f"fw.{short}.{name}"
            if _is_layer_class(obj) and issubclass(obj, keras.Model):
                found[where] = _container_builder(obj)
            elif _is_layer_class(obj):
                found[where] = _layer_builder(obj, _kwargs(obj, where))
            elif inspect.isfunction(obj) and _returns_model(obj):
                found[where] = _model_builder(obj, _kwargs(obj, where))
    return found


def _returns_model(func: Callable) -> bool:
    return "Model" in str(inspect.signature(func).return_annotation)


def _model_builder(func: Callable, kwargs: dict[str, Any]) -> Callable[[], keras.Model]:
    return lambda: func(**kwargs)


def _layer_builder(cls: type, kwargs: dict[str, Any]) -> Callable[[], keras.Model]:
    """Images -> the layer -> (flatten) -> a 3-class head."""
    def build() -> keras.Model:
        layer = cls(**kwargs)
        flat = len(layer.compute_output_shape((None, *IMAGE_SHAPE))) == 2
        head = [] if flat else [keras.layers.Flatten()]
        return fw.Sequential([keras.Input(IMAGE_SHAPE), layer, *head,
                              fw.layers.Classifier(NUM_CLASSES)])
    return build


def _container_builder(cls: type) -> Callable[[], keras.Model]:
    """A model class (`fw.Sequential`) holding a block with BatchNorm and Dropout."""
    return lambda: cls([keras.Input(IMAGE_SHAPE), keras.layers.Flatten(),
                        fw.layers.DenseBN(4, drop_rate=0.25), fw.layers.Classifier(3)])


# --------------------------------------------------------------------------- data and runs


def _data(model: keras.Model, n: int = 40) -> tuple[np.ndarray, np.ndarray, bool]:
    """Random inputs of the model's shape; class labels, or regression targets."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, *model.input_shape[1:])).astype(np.float32)
    outputs = model.output_shape[-1]
    if outputs == NUM_CLASSES:
        return x, rng.integers(0, NUM_CLASSES, size=n).astype(np.int32), True
    return x, rng.normal(size=(n, outputs)).astype(np.float32), False


def _estimator(build: Callable[[], keras.Model], classify: bool, work_dir: str,
               **kwargs: Any) -> Any:
    opt_func = fw.train.sgd_optimizer(0.05, mom=0.9, wd=5e-4)
    make = fw.train.get_clf_model_func if classify else fw.train.get_reg_model_func
    return fw.train.get_tpu_estimator(4, make(build, opt_func), work_dir, trn_bs=8,
                                      val_bs=24, seed=1, steps_per_loop=4, verbose=False,
                                      **kwargs)


def _inputs(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    train = lambda params: fw.data.numpy_ds(x, y, params["batch_size"], seed=2)
    evaluate = lambda params: fw.data.numpy_ds(x, y, params["batch_size"], training=False)
    return train, evaluate


def _state(est: Any) -> dict[str, Any]:
    return {"model": [np.asarray(v).tolist() for v in est.model.variables],
            "paths": [v.path for v in est.model.variables],
            "optimizer": [np.asarray(v).tolist() for v in est.optimizer.variables]}


def _saved_model_variables(work_dir: str) -> int:
    """How many model variables the newest checkpoint holds (its arrays, read back)."""
    from fenwicks.train import run_format

    step = run_format.latest(work_dir)
    if step.startswith("gs://"):  # the arrays are read from a local copy
        record = run_format.read_record(step)
        return sum(len(record["layout"][group]) for group in ("trainable", "non_trainable"))
    arrays = run_format.read_arrays(step, run_format.read_record(step))
    return len(arrays["trainable"]) + len(arrays["non_trainable"])


def _selected(names: tuple[str, ...]) -> dict[str, Callable[[], keras.Model]]:
    found = entries()
    return {name: found[name] for name in names} if names else found


def _join(root: str, name: str) -> str:
    return f"{root}/{name}"  # local or gs://


def train(work_root: str, *names: str) -> dict[str, Any]:
    out = {}
    for name, build in _selected(names).items():
        x, y, classify = _data(build())
        work_dir = _join(work_root, name)
        est = _estimator(build, classify, work_dir)
        train_fn, eval_fn = _inputs(x, y)
        est.train(train_fn, steps=TRAIN_STEPS)
        out[name] = {**_state(est), "step": est.global_step,
                     "eval": est.evaluate(eval_fn), "predict": est.predict(eval_fn).tolist(),
                     "saved": _saved_model_variables(work_dir),
                     "in_model": len(est.model.variables)}
    return out


def check(work_root: str, *names: str) -> dict[str, Any]:
    """New estimators on the trained work_dirs, and warm starts from them."""
    out = {}
    for name, build in _selected(names).items():
        x, y, classify = _data(build())
        work_dir = _join(work_root, name)
        train_fn, eval_fn = _inputs(x, y)
        est = _estimator(build, classify, work_dir)
        result = est.evaluate(eval_fn)  # builds the model, restoring work_dir
        warm = _estimator(build, classify, _join(work_root, "warm/" + name),
                          warm_start_from=work_dir)
        warm.evaluate(eval_fn)
        out[name] = {**_state(est), "step": est.global_step, "eval": result,
                     "predict": est.predict(eval_fn).tolist(),
                     "warm_model": _state(warm)["model"],
                     "warm_report": warm.warm_start_report}
    return out


# --------------------------------------------------------------------------- a user's layer


class ListBlock(keras.layers.Layer):
    """A user's layer keeping its sublayers in a plain list, as Keras's guides do."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.blocks = [keras.layers.Dense(4, name="listed_dense"),
                       keras.layers.BatchNormalization(name="listed_bn"),
                       keras.layers.Dropout(0.25, name="listed_dropout")]

    def call(self, x: Any, training: Any = None) -> Any:
        for block in self.blocks:
            x = block(x, training=training)
        return x


def list_model() -> keras.Model:
    return keras.Sequential([keras.Input((5,)), ListBlock(), keras.layers.Dense(3)])


def user(work_dir: str, steps: str) -> list[Any]:
    """Trains `list_model` `steps` more steps on work_dir; returns its variables."""
    x = np.random.default_rng(0).normal(size=(32, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model_func = fw.train.get_clf_model_func(list_model, fw.train.sgd_optimizer(0.1))
    est = fw.train.get_tpu_estimator(4, model_func, work_dir, trn_bs=8, seed=1,
                                     verbose=False)
    est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=1), steps=int(steps))
    return [np.asarray(v).tolist() for v in est.model.variables]


if __name__ == "__main__":
    commands = {"train": train, "check": check, "user": user}
    print(json.dumps(commands[sys.argv[1]](*sys.argv[2:])))
