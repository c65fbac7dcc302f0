"""The compiled steps of the JAX engine, built from Keras's stateless API.

The training state is a tuple of lists of arrays, ``(trainable, non_trainable,
optimizer)``, in the order of ``model.trainable_variables``,
``model.non_trainable_variables`` and ``optimizer.variables``. A step maps a state and a
global batch to a new state; nothing reads or writes a Keras variable inside a compiled
function (`state.JaxRunState` moves the arrays in and out between calls).

Training runs a block of ``K`` steps in one ``jax.lax.scan`` over a ``[K, batch, ...]``
stack of global batches; a loop's remainder of fewer than ``K`` steps runs as blocks of
one step, so two compilations serve any number of steps and no step is computed for
nothing. Steps after a non-finite loss leave the state as it was (a select, carried
from block to block), so training stops at the step that went wrong, as the TensorFlow
loop does.

On the CPU the scan is unrolled: XLA:CPU runs a loop body, and the branches of a
``lax.cond``, about three times slower than the same step on its own (measured with
`benchmarks/jax_engine.py`'s network under load: 10 steps in a rolled scan 4.1 s, with a
``cond`` in it 4.4 s, unrolled 2.2 s, as 10 separate calls 1.5 s). Unrolling multiplies
the compile time by the block length, so the trainer's CPU blocks are one step long
(`trainer.CPU_BLOCK_STEPS`), and a block of one step is the step alone, with no scan
around it: a scan of length one ran as slowly as the rolled loop (0.82 s a step against
0.08 s at c=8).
On TPUs and GPUs the loop stays rolled, as XLA compiles it well there.

Loss reduction: the step sees the whole global batch (the mesh splits it), so the loss is
``sum(per-example loss) / global batch`` (``'mean'``) or the sum (``'sum'``) over every
example, and the update does not depend on the device count. Model regularisation
losses (``model.losses``) are added once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

from fenwicks.train import eval_sums, inputs
from fenwicks.train.jax import mesh
from fenwicks.train.model_func import ModelSpec

State = tuple[list[Any], list[Any], list[Any]]


def _float32(outputs: Any) -> Any:
    """Mixed-precision models may emit bfloat16/float16; losses are computed in float32."""
    return jax.tree.map(
        lambda t: t.astype(jnp.float32) if jnp.issubdtype(t.dtype, jnp.floating) else t,
        outputs)


def replicas_context(num_replicas: int) -> Any:
    """Per-replica BatchNorm (``bn='replica'``) sees the global batch under jit; this
    tells it how many replicas share it, so each slice gets its own statistics, as each
    replica does on the TensorFlow engine (`fw.layers.batch_replicas`, read at trace)."""
    from fenwicks import layers

    context = getattr(layers, "batch_replicas", None)
    return context(num_replicas) if context else contextlib.nullcontext()


def _weighted(values: Any, weights: Any) -> Any:
    values = jnp.asarray(values, jnp.float32)
    if weights is None:
        return values
    return values * jnp.reshape(jnp.asarray(weights, jnp.float32), values.shape)


def train_step_fn(spec: ModelSpec, optimizer: Any, global_batch_size: int,
                  num_replicas: int | None = None
                  ) -> Callable[[State, Any], tuple[State, Any]]:
    """``step(state, batch) -> (state, mean loss)``, not compiled: one training step over
    a global batch shared by `num_replicas` replicas (defaults to the mesh's devices)."""
    model = spec.model
    replicas = mesh.num_replicas() if num_replicas is None else num_replicas
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def loss_fn(trainable, non_trainable, optimizer_values, batch):
        features, labels, weights = inputs.unpack(batch)
        with replicas_context(replicas):
            outputs, non_trainable, losses = model.stateless_call(
                trainable, non_trainable, features, training=True, return_losses=True)
        loss_sum = jnp.sum(_weighted(spec.loss_fn(labels, _float32(outputs)), weights))
        loss = loss_sum / global_batch_size if spec.reduction == "mean" else loss_sum
        if losses:
            loss = loss + sum(jnp.asarray(x, jnp.float32) for x in losses)
        if scaled:  # the loss scale is an optimizer variable: read it from the state
            mapping = list(zip(optimizer.variables, optimizer_values, strict=True))
            with keras.StatelessScope(state_mapping=mapping):
                loss = optimizer.scale_loss(loss)
        return loss, (loss_sum, non_trainable)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: State, batch: Any) -> tuple[State, Any]:
        trainable, non_trainable, optimizer_values = state
        (_, (loss_sum, non_trainable)), grads = grad_fn(
            trainable, non_trainable, optimizer_values, batch)
        # Keras's stateless update (a LossScaleOptimizer's skips non-finite gradients
        # and adjusts its scale inside, with `ops.cond`).
        trainable, optimizer_values = optimizer.stateless_apply(
            optimizer_values, grads, trainable)
        return (trainable, non_trainable, optimizer_values), loss_sum / global_batch_size

    return step


def make_train_block(spec: ModelSpec, optimizer: Any, global_batch_size: int
                     ) -> Callable[[State, Any, Any], tuple[State, Any, Any, Any]]:
    """``block(state, done, batches) -> (state, done, losses [K], ran [K])``, jitted.

    `batches` stacks K global batches (``[K, batch, ...]``, split over the mesh on axis
    1); each length compiles once. `done` (a bool array, False to begin with) is set by
    a non-finite loss; from then on no step changes the state. The state's buffers are
    donated: the caller must not use the arrays it passed in.
    """
    step = train_step_fn(spec, optimizer, global_batch_size)

    def block(state: State, done: Any, batches: Any) -> tuple[State, Any, Any, Any]:
        def body(carry, batch):
            state, done = carry
            new_state, loss = step(state, batch)
            # A select, not a lax.cond: see the module doc; the step is computed anyway.
            state = jax.tree.map(lambda new, old: jnp.where(done, old, new),
                                 new_state, state)
            ran = jnp.logical_not(done)
            done = jnp.logical_or(done, ~jnp.isfinite(loss))
            return (state, done), (loss, ran)

        if jax.tree.leaves(batches)[0].shape[0] == 1:  # one step: no scan around it
            (state, done), (loss, ran) = body((state, done),
                                              jax.tree.map(lambda x: x[0], batches))
            return state, done, loss[None], ran[None]
        unroll = UNROLL_ON_CPU and jax.default_backend() == "cpu" or 1  # True: no loop
        (state, done), (losses, ran) = jax.lax.scan(body, (state, done), batches,
                                                    unroll=unroll)
        return state, done, losses, ran

    return jax.jit(block, donate_argnums=0, out_shardings=mesh.replicated())


# Blocks are unrolled on the CPU (the module doc says why). Public so that a test can
# run, on the CPU, the rolled loop that TPUs and GPUs run.
UNROLL_ON_CPU = True


def _non_finite_rows(features: Any) -> Any:
    rows = None
    for t in jax.tree.leaves(features):
        if not jnp.issubdtype(t.dtype, jnp.floating):
            continue
        bad = jnp.any(~jnp.isfinite(t).reshape(t.shape[0], -1), axis=1)
        rows = bad if rows is None else rows | bad
    return rows


def _bad_label_rows(labels: Any, outputs: Any) -> Any:
    """True where an integer class label lies outside a ``[B, C]`` output's classes."""
    if not (hasattr(labels, "dtype") and hasattr(outputs, "ndim")):
        return None
    if not jnp.issubdtype(labels.dtype, jnp.integer) or outputs.ndim != 2:
        return None
    if labels.ndim == 2 and labels.shape[-1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        return None
    return (labels < 0) | (labels >= outputs.shape[-1])


def make_eval_step(spec: ModelSpec) -> Callable[[list, list, Any, Any], Any]:
    """``step(trainable, non_trainable, batch, mask) -> sums``, jitted: the columns of
    `fenwicks.train.eval_sums` layout (loss sum, metric sums, count, weight sum, then
    the `eval_sums.CHECKS` counts), over the rows where `mask` is True."""
    return jax.jit(eval_step_fn(spec))


def eval_step_fn(spec: ModelSpec, num_replicas: int | None = None
                 ) -> Callable[[list, list, Any, Any], Any]:
    """`make_eval_step`'s step, not compiled, for `num_replicas` replicas (defaults to
    the mesh's devices)."""
    names = list(spec.metric_fns)
    model = spec.model
    replicas = mesh.num_replicas() if num_replicas is None else num_replicas

    def step(trainable, non_trainable, batch, mask):
        features, labels, weights = inputs.unpack(batch)
        with replicas_context(replicas):
            outputs, _ = model.stateless_call(trainable, non_trainable, features,
                                              training=False)
        outputs = _float32(outputs)
        values = [spec.loss_fn(labels, outputs)]
        values += [spec.metric_fns[name](labels, outputs) for name in names]
        weight = _weighted(jnp.ones(mask.shape, jnp.float32), weights)
        # where, not multiply: a NaN on a padding row must not leak into the sum.
        sums = [jnp.sum(jnp.where(mask, weight * jnp.asarray(v, jnp.float32), 0.0))
                for v in values]

        def masked_count(rows):
            return jnp.float32(0) if rows is None else jnp.sum(mask & rows, dtype=jnp.float32)

        checks = [masked_count(~jnp.isfinite(jnp.asarray(values[0], jnp.float32))),
                  masked_count(_non_finite_rows(features)),
                  masked_count(_bad_label_rows(labels, outputs))]
        return jnp.stack(eval_sums.row(sums, jnp.sum(mask, dtype=jnp.float32),
                                       jnp.sum(jnp.where(mask, weight, 0.0)), checks))

    return step


def make_predict_step(spec: ModelSpec) -> Callable[[list, list, Any], Any]:
    """``step(trainable, non_trainable, features) -> predictions``, jitted."""
    return jax.jit(predict_step_fn(spec))


def predict_step_fn(spec: ModelSpec, num_replicas: int | None = None
                    ) -> Callable[[list, list, Any], Any]:
    """`make_predict_step`'s step, not compiled, for `num_replicas` replicas."""
    model = spec.model
    replicas = mesh.num_replicas() if num_replicas is None else num_replicas

    def step(trainable, non_trainable, features):
        with replicas_context(replicas):
            outputs, _ = model.stateless_call(trainable, non_trainable, features,
                                              training=False)
        return spec.predict_fn(_float32(outputs))

    return step
