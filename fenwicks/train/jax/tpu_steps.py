"""`check_tpu_ready`'s steps on the JAX engine: the estimator's own jitted train, eval
and predict steps (`steps.py`), traced and lowered for the TPU on whatever host runs the
check (``jax.jit(...).trace(...).lower(lowering_platforms=('tpu',))`` needs no TPU).

The arguments are abstract (shapes, dtypes and shardings, no data) on an abstract mesh
of the target's device count, so a v5e-8's 8-way split of the global batch is checked on
a one-CPU notebook. What fails there fails on the TPU before a step runs: a tensor whose
size depends on the data (``x[x > 0]``, ``jnp.nonzero`` without ``size=``: JAX cannot
trace it at all), an operation that has no TPU lowering (``jnp.linalg.eig``), a batch
that does not split over the devices.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from fenwicks._text import first_line
from fenwicks.train import building
from fenwicks.train.inputs import unpack
from fenwicks.train.jax import mesh, steps
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tpu_ready import NotTPUReadyError, what

# JAX's errors for a value that must be known when the step is traced: a shape that
# depends on the data.
_DATA_DEPENDENT = (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError,
                   jax.errors.TracerArrayConversionError,
                   jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError)
# Frames of these packages are not the user's code: the message points past them.
_LIBRARIES = tuple(os.path.dirname(module.__file__) + os.sep for module in (jax, np))


def build_model(model_func: Any, params: dict, precision: str,
                features_spec: Any) -> tuple[ModelSpec, Any]:
    """A fresh model and optimizer for the check (nothing placed on the devices).

    Raises:
        NotTPUReadyError: a layer uses a tensor's value in Python (`value_in_python`).
    """
    with building.precision_policy(precision):
        try:
            return building.build_model(model_func, params, precision, features_spec)
        except Exception as err:
            found = traced_value_error(err)
            if found is None:
                raise
            raise NotTPUReadyError(value_in_python("the model", found)) from None


def traced_value_error(err: BaseException) -> BaseException | None:
    """JAX's error for a value needed while tracing, found in `err`'s chain, or None.

    Keras rebuilds a layer's error with a new message, and JAX's tracer errors cannot be
    rebuilt from a string: the user sees ``AttributeError: 'str' object has no
    attribute '_error_repr'`` (Keras 3.x, JAX 0.4+), with JAX's error as its context.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, _DATA_DEPENDENT):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def value_in_python(subject: str, err: BaseException) -> str:
    """One sentence: where `subject` (``'the model'``, ``'the training step'``) uses a
    tensor's value in Python, JAX's words, and the fix for that kind of use."""
    if isinstance(err, jax.errors.TracerBoolConversionError):
        use, fix = ("a tensor's value in a Python condition (if, while, and, or)",
                    "use keras.ops.where (or keras.ops.cond) instead of if")
    elif isinstance(err, jax.errors.TracerArrayConversionError):
        use, fix = ("a tensor as a NumPy array (np.asarray, .numpy())",
                    "use keras.ops instead of NumPy inside the layer")
    elif isinstance(err, jax.errors.TracerIntegerConversionError):
        use, fix = ("a tensor's value as a Python int", "keep it a tensor (keras.ops)")
    else:
        use, fix = ("a tensor of data-dependent size",
                    "keep shapes fixed: a mask (keras.ops.where) instead of boolean "
                    "indexing or unique, or a fixed size (jnp.nonzero(..., size=N))")
    said = first_line(err).rstrip(".")
    return (f"{subject} uses {use}{_where(err)}: {said}; a TPU (and jax.jit) compiles each "
            f"step for fixed shapes, without the data: {fix}")


def check_step(mode: str, spec: ModelSpec, optimizer: Any, batch: Any, global_batch: int,
               replicas: int) -> None:
    """Lowers the `mode` step for a TPU of `replicas` devices; `batch` is one replica's
    batch (the per-replica size), as `check_tpu_ready` reads it.

    Raises:
        NotTPUReadyError: naming the mode, the operation and the shape that fail.
    """
    devices = AbstractMesh((replicas,), (mesh.AXIS,))
    replicated = NamedSharding(devices, PartitionSpec())
    split = NamedSharding(devices, PartitionSpec(mesh.AXIS))
    model = spec.model
    state = tuple([_abstract(v.value, replicated) for v in group] for group in (
        model.trainable_variables, model.non_trainable_variables, optimizer.variables))
    rows = jax.tree.map(lambda x: _abstract(x, split, replicas), _numpy(batch))
    if mode == "train":
        function = steps.train_step_fn(spec, optimizer, global_batch, replicas)
        args = (state, rows)
    elif mode == "eval":
        function, args = steps.eval_step_fn(spec, replicas), (*state[:2], *rows)
    else:
        features = unpack(rows[0])[0]
        function, args = steps.predict_step_fn(spec, replicas), (*state[:2], features)
    _lower(mode, function, args)


def _numpy(batch: Any) -> Any:
    return jax.tree.map(lambda t: np.asarray(t), batch)


def _abstract(value: Any, sharding: NamedSharding, replicas: int = 1) -> Any:
    """The global array's shape and dtype, without its data: a per-replica batch's rows
    times the replicas."""
    shape = tuple(value.shape)
    if replicas > 1:
        shape = (shape[0] * replicas, *shape[1:])
    return jax.ShapeDtypeStruct(shape, value.dtype, sharding=sharding)


def _lower(mode: str, function: Any, args: tuple) -> None:
    try:
        try:
            jax.jit(function).trace(*args).lower(lowering_platforms=("tpu",))
        except AttributeError as err:  # JAX's error, rebuilt by Keras (traced_value_error)
            found = traced_value_error(err)
            if found is None:
                raise
            raise NotTPUReadyError(value_in_python(f"the {what(mode)} step", found)) from None
    except _DATA_DEPENDENT as err:
        raise NotTPUReadyError(
            f"the {what(mode)} step has a tensor of data-dependent size{_where(err)}: "
            f"{first_line(err)}; a TPU (and jax.jit) compiles fixed shapes. Keep shapes "
            "fixed: a mask (keras.ops.where) instead of boolean indexing, or a fixed "
            "size (jnp.nonzero(..., size=N))") from None
    except NotImplementedError as err:
        raise NotTPUReadyError(
            f"the {what(mode)} step uses an operation the TPU cannot run{_where(err)}: "
            f"{first_line(err)}; compute it in the input_fn or with other ops") from None
    except (TypeError, ValueError) as err:
        raise NotTPUReadyError(f"the {what(mode)} step does not compile for a TPU"
                               f"{_where(err)}: {first_line(err)}") from None


def _where(err: BaseException) -> str:
    """`` at file:line (`code`)``: the innermost frame of the user's code, if any."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(_LIBRARIES) and "/keras/" not in f.filename
              and "/fenwicks/" not in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {os.path.basename(frame.filename)}:{frame.lineno} (`{frame.line}`)"
