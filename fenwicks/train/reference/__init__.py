"""The reference engine: the `Engine` roles (`fenwicks.train.engines`) with NumPy alone.

A linear model (one Keras ``Dense`` layer, its weights read into dicts of NumPy arrays)
trained on the mean squared error by explicit gradient steps of plain SGD, its state and
checkpoints dicts of host arrays. It exists for the tests of the shared training code:
the save policy, resume and the input position, callbacks and actions, NaN handling,
preemption, the work_dir lock, history, progress and exact evaluation's bookkeeping run
on it in-process in milliseconds, where the real engines compile a model (and often need
a fresh process of 8 replicas). The real engines keep their own end-to-end tests
(`tests/test_engine_contract.py`, the flagship runs).

Nothing in this folder imports TensorFlow or JAX (a test greps it): what it needs of the
shared code (input functions, `InputContext`, the Keras model for callbacks) comes
through the shared modules, as a third engine's would. Its batches come through the
shared tf.data input path (`fenwicks.train.inputs`), as both real engines' do.

    with fenwicks.train.engines.use("reference"):
        est = fw.train.get_tpu_estimator(10, reference.linear_model_func(4), work_dir,
                                         trn_bs=8)
        est.train(input_fn, steps=20)
"""
