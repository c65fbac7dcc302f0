"""The TensorFlow engine: ``tf.distribute`` strategies, ``tf.function`` loops of
``steps_per_loop`` steps, its variables to and from the run format's host arrays, and
SavedModel export.

Beside it, `fenwicks.train.jax` implements the same roles on JAX; `fenwicks.train.engines`
chooses one. The modules:

- `devices.py`: what TensorFlow can reach, and the ``tf.distribute`` strategy this engine
  makes for it and holds (`strategy`, public as ``fw.train.tf.strategy()``).
- `backend.py`: Keras-on-TensorFlow facts for the layers and optimizers (the gradient
  all-reduce, per-replica variable updates).
- `state.py`: `RunState`, model, optimizer and step counters, restored from work_dir.
- `inputs.py`: `InputManager`, input_fn to distributed iterators, the resume position
  and exact-evaluation padding.
- `trainer.py`, `loops.py`: the compiled inner loop.
- `evaluation.py`: exact evaluation and prediction.
- `legacy_reader.py`, `checkpoints.py`: the TensorFlow checkpoints (``ckpt-<step>``) of
  work_dirs written before the run format, read only (restore, damage, warm start); a
  run's checkpoints are the run format's, `fenwicks.train.run_format`.
- `export.py`: SavedModel export.
- `tpu_ready.py`: `check_tpu_ready`, XLA compilation of the real steps.
- TPUEstimator's front door (TF1 code): `tpu_estimator.py` (`TPUEstimator`),
  `tf1_config.py` (`RunConfig`, `TPUConfig`, `TPUEstimatorSpec`, ...), `model_fn_runner.py`
  (the model_fn as the Keras model the engine trains), `input_fns.py` (the input_fns as
  the engine's), `_model_fn.py` (the model_fn's calls: Keras objects replayed, TF1 names
  patched), `tf1_gradients.py`, `tf1_metrics.py`, `tf1_optimizers.py`,
  `tf1_variables.py` (the TF1 names' stand-ins), `assignment_map.py` (warm-start maps
  by TF1 name).
"""

from fenwicks.train.tf.devices import strategy  # noqa: E402, F401  (public: fw.train.tf.strategy)
