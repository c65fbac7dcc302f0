"""TPUEstimator's names on the Fenwicks estimator: a TPUEstimator program ports with a
handful of edits (tutorials/PORTING.md, 'TPUEstimator programs').

Examples:
    >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
    ...     logits = keras.layers.Dense(2)(features)
    ...     probabilities = tf.nn.softmax(logits)
    ...     if mode == fw.train.ModeKeys.PREDICT:
    ...         return fw.train.TPUEstimatorSpec(mode, predictions={
    ...             'class_ids': tf.argmax(logits, -1), 'probabilities': probabilities})
    ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    ...     accuracy = lambda labels, logits: {
    ...         'accuracy': tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    ...     return fw.train.TPUEstimatorSpec(
    ...         mode, loss=loss, optimizer=keras.optimizers.SGD(0.5),
    ...         eval_metrics=(accuracy, [labels, logits]))
    >>> x, y = np.eye(2, dtype='float32').repeat(5, 0), np.arange(10) // 5   # y = argmax(x)
    >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
    ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
    >>> eval_input_fn = lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
    ...     params['batch_size'])
    >>> config = fw.train.RunConfig(model_dir='run', save_checkpoints_steps=10,
    ...                             tpu_config=fw.train.TPUConfig(iterations_per_loop=10))
    >>> est = fw.train.TPUEstimator(model_fn=model_fn, config=config, train_batch_size=8,
    ...                             eval_batch_size=4, verbose=False)
    >>> est.train(train_input_fn, max_steps=20).estimator.global_step
    20
    >>> result = est.evaluate(eval_input_fn)   # every example once, no steps needed
    >>> result['accuracy'], result['num_examples']   # 10: the last batch of 4 was half full
    (1.0, 10)
    >>> for pred in est.predict(lambda params: eval_input_fn(params).map(lambda x, y: x).take(1)):
    ...     print(pred['class_ids'])   # one dict per example
    0
    0
    0
    0

``model_fn(features, labels, mode, params)`` returns a `TPUEstimatorSpec`. It runs inside
a `tf.function`, as a TF1 graph function ran, and builds its network from Keras layers;
the layers it creates on its first calls are handed back on later calls, so train, eval
and predict share one set of variables (`fenwicks.train.tf._model_fn`; `model_fn_runner`
makes the model_fn the Keras model the engine trains, `input_fns` makes the input_fns
the engine's). Everything the estimator adds comes along: exact evaluation, resume from
``model_dir``, ``gs://`` or local storage, background checkpoint writes, the same run on
a TPU, GPUs or the CPU.

What cannot work in TensorFlow 2, and fails with a message saying so: variables made
outside Keras and ``tf.compat.v1.get_variable`` (``tf.compat.v1.layers``, a hand-made
``tf.Variable``), graph collections (``tf.compat.v1.get_collection``: Keras layers apply
their own batch-norm updates and regularisers), ``train_op``s of stock TF1 optimizers
other than GradientDescent, Momentum and Adam (pass ``optimizer=`` instead), metrics that
are not a ratio of per-example sums (``auc``), ``SessionRunHook``s, ``tf.summary`` and
``ExponentialMovingAverage`` in a model_fn, ``Scaffold(init_fn=...)``. Gradient code
(``tf.gradients``, clipping, ``apply_gradients``, ``CrossShardOptimizer``) trains as TF1
trained it (`fenwicks.train.tf.tf1_gradients`), and a TF1 optimizer of a program's own
(BERT's AdamWeightDecayOptimizer) runs as written. Arguments that have no
effect here (``host_call``, ``RunConfig(session_config=)``, ...) give one warning each.
On the jax engine the front door is refused at construction, in one sentence
(`Engine.tf1_model_fn_refusal`), before this module is imported: ``fw.train.TPUEstimator``
asks the engine first (`fenwicks.train.__getattr__`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks import accel
from fenwicks.train import engines, run_format
from fenwicks.train.estimator import Estimator, get_tpu_estimator
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import _model_fn as mf
from fenwicks.train.tf import assignment_map, input_fns
from fenwicks.train.tf.model_fn_runner import Runner, Serving, finish_metrics
from fenwicks.train.tf.tf1_config import (
    DEVICE_WHY,
    ENGINE_MODE_OF,
    InputPipelineConfig,
    RunConfig,
    TPUEstimatorSpec,
    WarmStartSettings,
    warn_once,
)

__all__ = ["TPUEstimator"]

logger = logging.getLogger("fenwicks")


class TPUEstimator:
    """TPUEstimator's constructor and methods on the Fenwicks `Estimator`.

    Args:
        model_fn: ``model_fn(features, labels, mode, params)`` (``labels``, ``mode``,
            ``params`` and ``config`` optional, by name) returning a `TPUEstimatorSpec`.
        model_dir: checkpoints and logs; the run resumes from here. Defaults to
            ``config.model_dir``, else a new temporary directory (with a warning).
        config: a `RunConfig`. Defaults to ``RunConfig()``.
        params: a dict given to every input_fn and model_fn, beside ``'batch_size'``
            (the model_fn's: per replica; each input_fn's: by TPUEstimator's rule for
            ``TPUConfig(per_host_input_for_training=...)``, `InputPipelineConfig`),
            ``'num_shards'`` and ``'num_replicas'`` (the replica count), ``'use_tpu'``
            and Fenwicks' own keys (`fenwicks.train.inputs.make_params`), which the
            params may not hold (refused, naming the key).
        use_tpu, eval_on_tpu: accepted; the accelerator is `fw.accel`'s
            (``fw.accel.configure`` chooses another), and a ``use_tpu`` that says
            otherwise gives a warning, once. ``use_tpu=False`` gives input_fns the global
            batch, as TPUEstimator on the CPU did.
        export_to_tpu, export_to_cpu, batch_axis, export_saved_model_api_version:
            accepted with a warning, once each, that they have no effect, when not the
            defaults.
        train_batch_size: global training batch size. Defaults to 128.
        eval_batch_size: global evaluation batch size. Defaults to `train_batch_size`.
        predict_batch_size: global prediction batch size. Defaults to `eval_batch_size`.
        warm_start_from: a checkpoint or directory, or `WarmStartSettings` (by variable
            name, with renames). A TF1 (name-based) checkpoint, or the model_dir (or one
            step) of another TPUEstimator run, warm-starts every trainable variable by
            its TF1 name, as TF1's did: a variable missing from it, or whose shape
            differs, raises. A Keras model_func's work_dir (`get_tpu_estimator`'s),
            whose variables have no TF1 names, loads every variable whose Keras path and
            shape match. A path holding no checkpoint is refused at once.
        labels_key: for inputs whose features dict holds the labels (BERT's
            ``'label_ids'``): the model_fn gets ``features[labels_key]`` as ``labels``
            (the key stays in the features). Defaults to None.
        steps_per_epoch: steps per epoch, for epoch logs and callbacks. Defaults to
            ``iterations_per_loop``.
        precision: as `get_tpu_estimator`'s. Defaults to ``'auto'``.
        verbose: show a progress bar. Defaults to True.

    Examples:
        >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
        ...     logits = keras.layers.Dense(2)(features)
        ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        ...     return fw.train.TPUEstimatorSpec(mode, loss=loss,
        ...                                      optimizer=keras.optimizers.SGD(0.5))
        >>> est = fw.train.TPUEstimator(model_fn=model_fn, config=fw.train.RunConfig(
        ...     model_dir='run', tpu_config=fw.train.TPUConfig(10)), train_batch_size=8,
        ...     params={'data_dir': 'data'}, verbose=False)
        >>> params = est.model_fn_params(fw.train.ModeKeys.TRAIN)   # what model_fn gets
        >>> params['data_dir'], params['batch_size'] * params['num_shards']   # global batch
        ('data', 8)

        ``est.train(train_input_fn, max_steps=1000)`` then trains it (`train`).
    """

    def __init__(self, model_fn: Callable[..., TPUEstimatorSpec], model_dir: str | None = None,
                 config: RunConfig | None = None, params: Mapping[str, Any] | None = None,
                 use_tpu: bool = True, train_batch_size: int | None = None,
                 eval_batch_size: int | None = None, predict_batch_size: int | None = None,
                 batch_axis: Any = None, eval_on_tpu: bool = True,
                 export_to_tpu: bool = True, export_to_cpu: bool = True,
                 warm_start_from: str | WarmStartSettings | None = None,
                 embedding_config_spec: Any = None,
                 export_saved_model_api_version: Any = None, *,
                 labels_key: str | None = None, steps_per_epoch: int | None = None,
                 precision: str = "auto", verbose: bool = True) -> None:
        if not callable(model_fn):
            raise ValueError(f"model_fn={model_fn!r} must be callable (features, labels, "
                             "mode, params) -> fw.train.TPUEstimatorSpec")
        if embedding_config_spec is not None:
            raise ValueError("embedding_config_spec (TPU embeddings) has no counterpart in "
                             "Fenwicks; use keras.layers.Embedding in the model_fn")
        _check_engine()
        self.model_fn = model_fn
        self.config = config if config is not None else RunConfig()
        if not isinstance(self.config, RunConfig):
            raise ValueError(f"config={config!r} must be fw.train.RunConfig(...)")
        self.model_dir = model_dir or self.config.model_dir or _temporary_model_dir()
        params = dict(params or {})
        if "batch_size" in params:
            raise ValueError(f"params['batch_size']={params['batch_size']!r}: give "
                             "train_batch_size= (global), as TPUEstimator required")
        for key in sorted(set(params) & set(_RESERVED_PARAMS)):
            raise ValueError(f"params[{key!r}]={params[key]!r}: Fenwicks sets "
                             f"params[{key!r}] itself ({_RESERVED_PARAMS[key]}), which "
                             "would replace yours: rename your key")
        self.params = params
        self.use_tpu = bool(use_tpu)
        self.train_batch_size = 128 if train_batch_size is None else train_batch_size
        self.eval_batch_size = eval_batch_size or self.train_batch_size
        self.predict_batch_size = predict_batch_size or self.eval_batch_size
        self.labels_key = labels_key
        self.warm_start_from = _warm_start_settings(warm_start_from)
        self.warm_start_report: dict[str, list[str]] | None = None
        self.element_specs: dict[str, Any] = {}
        self._steps_per_epoch = steps_per_epoch
        self._precision = precision
        self._verbose = verbose
        self._est: Estimator | None = None
        self._built_for: str | None = None
        self.runner: Runner | None = None
        self._check_shards()
        self._check_device(use_tpu, eval_on_tpu)
        given = {"export_to_tpu": export_to_tpu, "export_to_cpu": export_to_cpu,
                 "batch_axis": batch_axis,
                 "export_saved_model_api_version": export_saved_model_api_version}
        for name, (default, why) in _IGNORED_ARGUMENTS.items():
            if given[name] != default:
                warn_once(f"TPUEstimator.{name}", f"TPUEstimator({name}={given[name]!r}) "
                          f"has no effect and is ignored: {why}")
        if (self.config.tpu_config.per_host_input_for_training == InputPipelineConfig.BROADCAST
                and self.num_replicas > 1):
            raise ValueError(
                f"per_host_input_for_training=BROADCAST gives each of the {self.num_replicas}"
                " replicas a whole copy of every batch, which Fenwicks' engine does not do "
                "(each replica gets its own slice): use InputPipelineConfig.PER_HOST_V2, "
                "whose input_fn gets params['batch_size'] per replica")

    def _check_shards(self) -> None:
        wanted = self.config.tpu_config.num_shards or self.params.get("num_shards")
        replicas = self.num_replicas
        if wanted is not None and wanted != replicas:
            logger.warning("fenwicks: num_shards=%d asked for, but %d replica(s) are "
                           "available: training runs on %d, and params['num_shards'] says "
                           "so (batch sizes are global, so the update is the same)",
                           wanted, replicas, replicas)

    def _check_device(self, use_tpu: bool, eval_on_tpu: bool) -> None:
        """use_tpu and eval_on_tpu choose nothing here: say so when the run differs."""
        kind = accel.current().kind
        if bool(use_tpu) != (kind == "tpu"):
            warn_once("use_tpu", f"use_tpu={use_tpu!r} has no effect: this runs on the "
                       f"{kind}, which {DEVICE_WHY}")
        if use_tpu and not eval_on_tpu and kind == "tpu":
            warn_once("eval_on_tpu", "eval_on_tpu=False has no effect: evaluation runs "
                       "on the TPU, exact on any batch size")
        evidence = accel.tpu_host_evidence() if kind != "tpu" else []
        if evidence:
            warn_once("tpu_host", f"this is a TPU host ({', '.join(evidence[:2])}) whose "
                       "TensorFlow cannot reach the TPU, so fw.train.TPUEstimator trains on "
                       "the host CPU; to train on the TPU, write the model as a Keras "
                       "model_func (tutorials/PORTING.md, 'TPUEstimator programs on the jax "
                       "engine') and run it in a new Python process that imports fenwicks "
                       "before TensorFlow, without FENWICKS_ENGINE=tf, so the jax engine "
                       "is chosen")

    # ---------------------------------------------------------------- the engine

    @property
    def num_replicas(self) -> int:
        return engines.current().num_replicas(accel.current())  # the engine: one truth

    def batch_per_replica(self, mode: str) -> int:
        size = {"train": self.train_batch_size, "eval": self.eval_batch_size,
                "predict": self.predict_batch_size}[mode]
        return size // self.num_replicas

    def model_fn_params(self, mode: str, rows: int | None = None) -> dict[str, Any]:
        """The model_fn's params; ``'batch_size'`` is the rows of the batch it gets (the
        mode's per-replica batch, or fewer in the estimator's eager label check)."""
        batch = rows or self.batch_per_replica(ENGINE_MODE_OF[mode])
        # num_shards is the replicas there are (a program's own value, squeezenet's 8, is
        # replaced: num_shards * batch_size must stay the global batch).
        return {"use_tpu": self.use_tpu, **self.params, "batch_size": batch,
                "num_shards": self.num_replicas, "num_replicas": self.num_replicas}

    def _estimator(self, mode: str) -> Estimator:
        """The Fenwicks estimator; one built for predict only is replaced for training
        or evaluation (it has no optimizer slots or metrics)."""
        if self._est is not None and self._built_for == "predict" and mode != "predict":
            self._est.close()
            self._est = None
        if self._est is None:
            tpu = self.config.tpu_config
            loops = None
            if self.config.save_checkpoints_steps:
                loops = max(1, math.ceil(self.config.save_checkpoints_steps
                                         / tpu.iterations_per_loop))
            secs = self.config.save_checkpoints_secs
            if secs is None and loops is None:
                secs = 600.0
            warm = self.warm_start_from
            self.runner = Runner(self)
            self._built_for = None
            self._est = get_tpu_estimator(
                self._steps_per_epoch or tpu.iterations_per_loop, self._model_func,
                self.model_dir, trn_bs=self.train_batch_size, val_bs=self.eval_batch_size,
                pred_bs=self.predict_batch_size, steps_per_loop=tpu.iterations_per_loop,
                precision=self._precision, seed=self.config.tf_random_seed,
                warm_start_from=warm if isinstance(warm, str) else None,
                save_every_secs=secs, save_every_loops=loops,
                keep_checkpoints=self.config.keep_checkpoint_max, verbose=self._verbose)
        return self._est

    def _model_func(self, params: dict) -> ModelSpec:
        self._built_for = params["mode"]
        return self.runner.build(params)

    def apply_warm_start(self, variables: list[Any], records: list[mf.CallRecord]) -> None:
        """`WarmStartSettings` and the model_fn's ``init_from_checkpoint`` calls; the
        engine's restore then replaces them if model_dir has a checkpoint."""
        report: dict[str, list[str]] = {"loaded": [], "not_loaded": []}
        sources: list[tuple[str, Any]] = []
        if isinstance(self.warm_start_from, WarmStartSettings):
            settings = self.warm_start_from
            sources.append((settings.ckpt_to_initialize_from, assignment_map.settings_map(
                variables, settings.vars_to_warm_start, settings.var_name_to_prev_var_name)))
        seen = set()
        for record in records:
            for source, mapping in record.init_from_checkpoint:
                key = (source, tuple(sorted((k, str(v)) for k, v in mapping.items())))
                if key not in seen:
                    seen.add(key)
                    sources.append((source, mapping))
        restored = _own_checkpoint(self.model_dir) if sources else None
        if restored is not None:
            # The engine restores model_dir's own checkpoint over any warm start.
            self.warm_start_report = {"loaded": [], "not_loaded": [],
                                      "restored_instead": [restored]}
            logger.info("fenwicks: warm start not applied: model_dir holds %s, restored "
                        "instead", restored)
            return
        for source, mapping in sources:
            # Every mapped variable loads, or WarmStartError names the first that cannot
            # (missing from the checkpoint, another shape), as TF1's raised.
            report["loaded"] += assignment_map.warm_start(variables, source,
                                                          mapping)["loaded"]
        if sources:
            self.warm_start_report = report
            # The engine's state learns of it too: evaluate and predict then do not warn
            # that the model was never trained.
            self.estimator.parts.state.warm_start_report = report
            logger.info("fenwicks: warm start loaded %d variable(s)", len(report["loaded"]))

    def _wrapped(self, input_fn: Callable[..., Any], mode: str) -> Callable[[dict], Any]:
        return input_fns.engine_input_fn(self, input_fn, mode)

    # ---------------------------------------------------------------- TPUEstimator's API

    def train(self, input_fn: Callable[..., Any], hooks: Any = None, steps: int | None = None,
              max_steps: int | None = None, saving_listeners: Any = None, *,
              callbacks: Sequence[keras.callbacks.Callback] | None = None) -> TPUEstimator:
        """Trains `steps` more steps, or up to global step `max_steps`; resumes from
        model_dir. ``hooks``/``saving_listeners`` have no counterpart: use ``callbacks``.

        Examples:
            >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
            ...     logits = keras.layers.Dense(2)(features)
            ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            ...     return fw.train.TPUEstimatorSpec(mode, loss=loss,
            ...                                      optimizer=keras.optimizers.SGD(0.5))
            >>> x, y = np.eye(2, dtype='float32').repeat(5, 0), np.arange(10) // 5   # y = argmax(x)
            >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
            ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
            >>> est = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=8,
            ...                             verbose=False)
            >>> est.train(train_input_fn, max_steps=20).estimator.global_step
            20
            >>> est.train(train_input_fn, steps=5).estimator.global_step   # 5 more
            25
        """
        _no_hooks(hooks, saving_listeners)
        est = self._estimator("train")
        est.train(self._wrapped(input_fn, "train"), steps=steps, max_steps=max_steps,
                  callbacks=callbacks)
        return self

    def evaluate(self, input_fn: Callable[..., Any], steps: int | None = None,
                 hooks: Any = None, checkpoint_path: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        """Loss and eval_metrics over every example (or the first `steps` batches).

        Returns:
            ``{'loss', <each metric>, 'global_step', 'num_examples'}``; each metric is
            exact: its per-example sums over every example, padding rows of the last
            batch left out.

        Examples:
            >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
            ...     logits = keras.layers.Dense(2)(features)
            ...     probabilities = tf.nn.softmax(logits)
            ...     if mode == fw.train.ModeKeys.PREDICT:
            ...         return fw.train.TPUEstimatorSpec(mode, predictions={
            ...             'class_ids': tf.argmax(logits, -1), 'probabilities': probabilities})
            ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            ...     accuracy = lambda labels, logits: {
            ...         'accuracy': tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
            ...     return fw.train.TPUEstimatorSpec(
            ...         mode, loss=loss, optimizer=keras.optimizers.SGD(0.5),
            ...         eval_metrics=(accuracy, [labels, logits]))
            >>> x, y = np.eye(2, dtype='float32').repeat(5, 0), np.arange(10) // 5   # y = argmax(x)
            >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
            ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
            >>> eval_input_fn = lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
            ...     params['batch_size'])
            >>> est = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=8,
            ...                             eval_batch_size=4, verbose=False)
            >>> est.train(train_input_fn, max_steps=20).estimator.global_step
            20
            >>> est.evaluate(eval_input_fn)   # 10 examples: the last batch of 4 half full
            {'loss': ..., 'global_step': 20, 'num_examples': 10, 'accuracy': 1.0}
        """
        _no_hooks(hooks, None)
        _no_checkpoint_path(checkpoint_path)
        if name is not None:
            warn_once("evaluate.name", f"evaluate(name={name!r}) has no effect: Fenwicks "
                       "keeps one evaluation history in model_dir; keep the returned dict "
                       "to tell evaluations apart")
        result = self._estimator("eval").evaluate(self._wrapped(input_fn, "eval"), steps)
        return finish_metrics(result)

    def predict(self, input_fn: Callable[..., Any], predict_keys: Sequence[str] | None = None,
                hooks: Any = None, checkpoint_path: str | None = None,
                yield_single_examples: bool = True) -> Iterator[Any]:
        """Yields one prediction per example (a dict if the model_fn's predictions are a
        dict), in input order; with ``yield_single_examples=False``, batches of
        ``predict_batch_size``.

        Examples:
            >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
            ...     logits = keras.layers.Dense(2)(features)
            ...     probabilities = tf.nn.softmax(logits)
            ...     if mode == fw.train.ModeKeys.PREDICT:
            ...         return fw.train.TPUEstimatorSpec(mode, predictions={
            ...             'class_ids': tf.argmax(logits, -1), 'probabilities': probabilities})
            ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            ...     accuracy = lambda labels, logits: {
            ...         'accuracy': tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
            ...     return fw.train.TPUEstimatorSpec(
            ...         mode, loss=loss, optimizer=keras.optimizers.SGD(0.5),
            ...         eval_metrics=(accuracy, [labels, logits]))
            >>> x, y = np.eye(2, dtype='float32').repeat(5, 0), np.arange(10) // 5   # y = argmax(x)
            >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
            ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
            >>> est = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=8,
            ...                             eval_batch_size=4, verbose=False)
            >>> est.train(train_input_fn, max_steps=20).estimator.global_step
            20
            >>> predict_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
            ...     x[4:6]).batch(params['batch_size'])
            >>> for pred in est.predict(predict_input_fn):
            ...     print(pred['class_ids'], pred['probabilities'].sum())
            0 1.0
            1 1.0
        """
        _no_hooks(hooks, None)
        _no_checkpoint_path(checkpoint_path)
        est = self._estimator("predict")
        if self.runner is not None and self.runner.predict_error is not None:
            # The estimator was built for training, and the model_fn failed in PREDICT.
            raise self.runner.predict_error
        predictions = tf.nest.map_structure(  # plain arrays, as TPUEstimator yielded
            lambda a: np.asarray(a).view(np.ndarray),
            est.predict(self._wrapped(input_fn, "predict")))
        if not isinstance(predictions, dict) and predict_keys is not None:
            raise ValueError(f"predict_keys={list(predict_keys)}: the model_fn's predictions "
                             "are one tensor, not a dict, and TF1's predict refused "
                             "predict_keys there too: drop predict_keys, or return "
                             "predictions={'name': tensor, ...}")
        if isinstance(predictions, dict) and predict_keys is not None:
            missing = set(predict_keys) - set(predictions)
            if missing:
                raise ValueError(f"predict_keys={list(predict_keys)}: {sorted(missing)} are "
                                 f"not among the predictions {sorted(predictions)}")
            predictions = {key: predictions[key] for key in predict_keys}
        rows = len(tf.nest.flatten(predictions)[0])
        step = 1 if yield_single_examples else self.predict_batch_size
        for start in range(0, rows, step):
            part = tf.nest.map_structure(
                lambda a, s=start: a[s] if yield_single_examples else a[s:s + step],
                predictions)
            yield part

    def export_saved_model(self, export_dir_base: str,
                           serving_input_receiver_fn: Any = None, **unused: Any) -> str:
        """Writes a SavedModel of the PREDICT-mode predictions into a new version folder
        ``<export_dir_base>/<version>``, as TPUEstimator does, and returns its path; its
        ``serve(features)`` takes a batch of features as the predict input_fn yields them.
        ``serving_input_receiver_fn`` and the other TPUEstimator keywords are accepted
        with a warning, once, that they have no effect.

        Examples:
            >>> def model_fn(features, labels, mode, params):   # a linear classifier, as in TF1
            ...     logits = keras.layers.Dense(2)(features)
            ...     probabilities = tf.nn.softmax(logits)
            ...     if mode == fw.train.ModeKeys.PREDICT:
            ...         return fw.train.TPUEstimatorSpec(mode, predictions={
            ...             'class_ids': tf.argmax(logits, -1), 'probabilities': probabilities})
            ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            ...     accuracy = lambda labels, logits: {
            ...         'accuracy': tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
            ...     return fw.train.TPUEstimatorSpec(
            ...         mode, loss=loss, optimizer=keras.optimizers.SGD(0.5),
            ...         eval_metrics=(accuracy, [labels, logits]))
            >>> x, y = np.eye(2, dtype='float32').repeat(5, 0), np.arange(10) // 5   # y = argmax(x)
            >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
            ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
            >>> est = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=8,
            ...                             eval_batch_size=4, verbose=False)
            >>> est.train(train_input_fn, max_steps=20).estimator.global_step
            20
            >>> path = est.export_saved_model('export')   # export/<version>
            >>> loaded = tf.saved_model.load(path)   # keep it: it owns the variables
            >>> loaded.serve(x[4:6])['class_ids'].numpy()
            array([0, 1])
        """
        from fenwicks.train import export_dirs
        from fenwicks.train.tf import export
        if serving_input_receiver_fn is not None:
            warn_once("serving_input_receiver_fn", "export_saved_model("
                       "serving_input_receiver_fn=...) has no effect: the SavedModel's "
                       "serve(features) takes a batch of the features the input_fns yield "
                       "(parse serialized tf.Examples before calling it)")
        for name in sorted(unused):
            warn_once(f"export.{name}", f"export_saved_model({name}=...) has no effect "
                       "and is ignored: the export is the latest checkpoint's PREDICT mode "
                       "as one serving_default signature")
        est = self._estimator(self._built_for or "predict")
        spec = est.parts.state.spec  # raises the "built on first use" error before any call
        features_spec = est.parts.state.features_spec["features"]
        serving = dataclasses.replace(spec, model=Serving(spec.model))
        return export_dirs.write(export_dir_base, lambda folder: export.export_saved_model(
            serving, features_spec, folder))

    @property
    def estimator(self) -> Estimator:
        """The Fenwicks `Estimator` underneath (history, callbacks, check_input)."""
        return self._estimator(self._built_for or "train")

    def get_variable_names(self) -> list[str]:
        """Names of the model's variables for warm-start maps: each one's TF1 name
        (``bert/encoder/layer_0/attention/self/query/kernel``; an unscoped Keras layer's is
        its Keras path), as ``tf.compat.v1.trainable_variables()`` names them."""
        if self.runner is None:
            return []
        return [assignment_map.current_name(v) for v in self.runner.replay.variables()]

    def close(self) -> None:
        if self._est is not None:
            self._est.close()

    def __enter__(self) -> TPUEstimator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# TPUEstimator arguments that change nothing here: their defaults, and why.
_EXPORT_WHY = ("export_saved_model writes one SavedModel of the PREDICT mode, which serves "
               "on the CPU or any device")
_IGNORED_ARGUMENTS = {
    "export_to_tpu": (True, _EXPORT_WHY), "export_to_cpu": (True, _EXPORT_WHY),
    "export_saved_model_api_version": (None, _EXPORT_WHY),
    "batch_axis": (None, "the batch is the first axis of every feature, split between the "
                         "replicas")}

# The params keys the front door sets for every input_fn and model_fn, and what they say
# (batch_size and num_shards: see __init__ and _check_shards).
_RESERVED_PARAMS = {"global_batch_size": "the mode's global batch size",
                    "num_replicas": "the replica count", "seed": "RunConfig.tf_random_seed",
                    "mode": "the engine's mode", "precision": "the compute precision",
                    "steps_per_epoch": "steps per epoch",
                    "input_context": "tf.distribute's InputContext"}


def _warm_start_settings(warm: str | WarmStartSettings | None
                         ) -> str | WarmStartSettings | None:
    """``warm_start_from`` as it is applied. A TF1 (name-based) checkpoint given as a path,
    or a Fenwicks run of a TPUEstimator model_fn (its record holds the TF1 names),
    warm-starts every trainable variable by its TF1 name, as TF1's did (a
    `WarmStartSettings` of all); a Keras model_func's Fenwicks run, or TensorFlow 2's
    object-based checkpoint, is the engine's warm start of the whole model (by Keras
    path). A path with no checkpoint is refused."""
    if warm is None:
        return None
    if isinstance(warm, WarmStartSettings):
        assignment_map.checkpoint_path(warm.ckpt_to_initialize_from,
                                       "WarmStartSettings(ckpt_to_initialize_from)")
        return warm
    if not isinstance(warm, str):
        raise ValueError(f"warm_start_from={warm!r} must be a checkpoint path or "
                         "fw.train.WarmStartSettings(...)")
    step = assignment_map.fenwicks_step(warm)
    if step is not None:
        return WarmStartSettings(warm) if assignment_map.is_name_based(step) else step
    if _own_checkpoint(warm):
        return warm  # an older Fenwicks run's TensorFlow checkpoint: the engine's
    return WarmStartSettings(warm) if assignment_map.is_name_based(warm) else warm


def _own_checkpoint(model_dir: str) -> str | None:
    """The checkpoint a Fenwicks run in `model_dir` restores (its run-format step, or an
    older run's TensorFlow checkpoint), if any."""
    return run_format.latest(model_dir) or tf.train.latest_checkpoint(model_dir)


def _no_hooks(hooks: Any, listeners: Any) -> None:
    if hooks or listeners:
        raise TypeError("hooks and saving_listeners are TF1 SessionRunHooks, which need a "
                        "TF1 session; pass Keras callbacks: est.train(..., callbacks=[...])")


def _no_checkpoint_path(checkpoint_path: str | None) -> None:
    if checkpoint_path is not None:
        raise TypeError(f"checkpoint_path={checkpoint_path!r}: Fenwicks evaluates and "
                        "predicts with the latest checkpoint of model_dir; make a "
                        "TPUEstimator on that checkpoint's directory")


def _check_engine() -> None:
    """A TF1 model_fn runs on engines that can run TensorFlow graphs; the others say so
    in one sentence, before any work (`Engine.tf1_model_fn_refusal`)."""
    refusal = engines.current().tf1_model_fn_refusal()
    if refusal:
        raise ValueError(refusal)


def _temporary_model_dir() -> str:
    path = tempfile.mkdtemp(prefix="fenwicks_model_dir_")
    logger.warning("fenwicks: no model_dir given; using the temporary %s", path)
    return path
