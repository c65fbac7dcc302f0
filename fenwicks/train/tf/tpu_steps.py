"""`check_tpu_ready`'s steps on the TensorFlow engine: the estimator's own train, eval
and predict steps (`loops.py`), lowered to XLA's HLO as `TPUStrategy` compiles them
(``jit_compile=True``, one replica, the TPU's per-replica batch)."""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import loops
from fenwicks.train.tpu_ready import NotTPUReadyError, what

PY_FUNC_OPS = ("EagerPyFunc", "PyFunc", "PyFuncStateless")
_UNSUPPORTED_RE = re.compile(r"(\w+) \(No registered '\w+' OpKernel for XLA_")
_RESULT_RE = re.compile(r"=\s+(\S+)\s")  # an HLO instruction's result type
_OP_META_RE = re.compile(r'op_type="([^"]+)" op_name="([^"]+)"')


def check_step(mode: str, spec: ModelSpec, optimizer: Any, batch: Any, global_batch: int,
               replicas: int) -> None:
    """Lowers the `mode` step for `batch` as a TPU would; raises `NotTPUReadyError`."""
    step = {"train": lambda: loops.train_step_fn(spec, optimizer, global_batch, replicas),
            "eval": lambda: loops.eval_step_fn(spec),
            "predict": lambda: loops.predict_step_fn(spec)}[mode]()
    _compile(mode, step, batch)


def _compile(mode: str, step: Any, batch: Any) -> None:
    """Lowers `step` to HLO with XLA as TPUStrategy would; raises naming what fails."""
    function = tf.function(step, jit_compile=True)
    graph = function.get_concrete_function(batch).graph
    for op in graph.get_operations():
        if op.type in PY_FUNC_OPS:
            raise NotTPUReadyError(
                f"the {what(mode)} step calls Python (op {op.name!r}, {op.type}: a "
                "tf.py_function or tf.numpy_function), which cannot run on a TPU; do that "
                "work in the input_fn (dataset.map) or with TensorFlow ops")
    try:
        hlo = function.experimental_get_compiler_ir(batch)(stage="hlo")
    except (ValueError, tf.errors.OpError) as err:
        message = str(err)
        unsupported = _UNSUPPORTED_RE.findall(message)
        if unsupported:
            names = [op.name for op in graph.get_operations() if op.type in unsupported]
            kind = ("string ops cannot run on a TPU; turn strings into numbers in the "
                    "input_fn" if any(_is_string_op(graph, t) for t in unsupported) else
                    "compute it in the input_fn or replace it with ops XLA supports")
            raise NotTPUReadyError(
                f"the {what(mode)} step does not compile with XLA (as on a TPU): op "
                f"{', '.join(map(repr, names or unsupported))} ({', '.join(unsupported)}) has "
                f"no XLA kernel; {kind}") from None
        first = next((line for line in message.splitlines() if line.strip()), message)
        raise NotTPUReadyError(f"the {what(mode)} step does not compile with XLA (as on a "
                               f"TPU): {first}") from None
    for line in hlo.splitlines():
        result, meta = _RESULT_RE.search(line), _OP_META_RE.search(line)
        if result and meta and "<=" in result.group(1):
            raise NotTPUReadyError(
                f"the {what(mode)} step has a tensor of data-dependent size: op "
                f"{meta.group(2)!r} ({meta.group(1)}) gives {result.group(1)} (at most "
                "the bound after '<='); a TPU pads it to the bound or fails to compile. "
                "Keep shapes fixed: use a mask (tf.where) instead of tf.boolean_mask, "
                "fixed-size outputs instead of tf.unique")


def _is_string_op(graph: tf.Graph, op_type: str) -> bool:
    for op in graph.get_operations():
        if op.type == op_type:
            return any(t.dtype == tf.string for t in (*op.inputs, *op.outputs))
    return False
