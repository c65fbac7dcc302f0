"""The JAX engine: the estimator's roles on Keras 3's JAX backend.

The estimator (`fenwicks.train.estimator`) is engine-neutral: it asks an engine
(`fenwicks.train.engines`) for four roles and drives them the same way on either engine.
This package supplies them on JAX, one concept per module:

- `mesh`: the devices, a 1-D ``jax.sharding.Mesh`` over all of them (data parallel, as
  ``keras.distribution.DataParallel``), and where variables (replicated) and batches
  (split on their first axis) live.
- `steps`: the ``jax.jit``-compiled train, eval and predict steps, built from Keras's
  stateless API (``model.stateless_call``, the optimizer under a ``StatelessScope``);
  training runs blocks of steps in one ``jax.lax.scan``.
- `inputs`: the user's ``input_fn(params)`` (a ``tf.data.Dataset``) read as NumPy global
  batches, padded and masked for exact evaluation.
- `checkpoints`: every variable and counter in orbax-checkpoint's format (atomic, async).
- `state`: model, optimizer, counters and checkpoints (the `RunState` role).
- `trainer`: the compiled inner loop (the `Trainer` role), returning `LoopOutput`.
- `evaluation`: exact evaluation and prediction (the `Evaluator` role).

Nothing here is imported unless Keras runs on JAX (``keras.backend.backend() == 'jax'``).
"""
