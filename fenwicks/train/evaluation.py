"""Exact evaluation and prediction, shared by both engines: sums of the padded, masked
batches finished on the host in float64 (the engines' compiled steps make them), and a
smaller batch after a GPU out-of-memory error.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from fenwicks import accel
from fenwicks.train.eval_sums import EvalTotals
from fenwicks.train.inputs import InputFn, InputManager
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.progress import write_eval_summary
from fenwicks.train.run_state import NonFiniteLossError, RunState

logger = logging.getLogger("fenwicks")


class Evaluator(abc.ABC):
    """Evaluates and predicts with one `RunState`'s model: the checks, the halving after
    an out-of-memory error, the result. Each engine subclasses it with its compiled
    steps (`_eval_totals`, `_predictions`).

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.options import EstimatorConfig
        >>> config = EstimatorConfig(steps_per_epoch=4, work_dir=tempfile.mkdtemp(),
        ...                          train_batch_size=8, eval_batch_size=4,
        ...                          predict_batch_size=4, steps_per_loop=2,
        ...                          precision='float32', num_replicas=1, verbose=False)
        >>> X = np.ones((16, 3), 'float32')
        >>> y = X.sum(1, keepdims=True)   # 3: a zero model's squared error is 9
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                           training=False)
        >>> with engines.use('reference') as engine:   # or engines.current()
        ...     acc = fw.accel.current()
        ...     state = engine.RunState(linear_model_func(3, kernel_initializer='zeros'),
        ...                             config, acc)
        ...     input_manager = engine.InputManager(config, acc)
        ...     probe = input_manager.probe(eval_fn, 'eval')   # the estimator does this
        ...     state.build(probe.features_spec, probe.params)   # on first use
        ...     evaluator = engine.Evaluator(config, acc, state, input_manager)
        ...     evaluator.evaluate(eval_fn, None)
        {'loss': 9.0, 'mse': 9.0, 'mae': 3.0, 'global_step': 0, 'num_examples': 16}
    """

    def __init__(self, config: EstimatorConfig, accelerator: accel.Accelerator, state: RunState,
                 input_manager: InputManager) -> None:
        self.config = config
        self._acc = accelerator
        self._state = state
        self._inputs = input_manager
        self._loops: dict[str, Any] = {}

    def with_smaller_batches(self, run: Callable[[int], Any], global_batch: int,
                             what: str) -> Any:
        """Runs `run(batch)`, halving the batch after an out-of-memory error on a GPU
        (keeping it a multiple of the engine's replicas)."""
        replicas = self.config.num_replicas
        while True:
            try:
                return run(global_batch)
            except Exception as err:
                if not self.is_out_of_memory(err):
                    raise
                smaller = (global_batch // replicas // 2) * replicas
                if smaller < replicas:
                    raise
                logger.warning("fenwicks: out of memory at %s batch %d; retrying with %d "
                               "(results are unchanged: evaluation is exact)", what,
                               global_batch, smaller)
                global_batch = smaller

    @abc.abstractmethod
    def _eval_totals(self, input_fn: InputFn, global_batch: int,
                     steps: int | None) -> EvalTotals:
        """The masked sums of the evaluation (`eval_sums`' columns) over every example,
        added up in float64."""

    @abc.abstractmethod
    def _predictions(self, input_fn: InputFn, global_batch: int) -> list[Any]:
        """``[(predictions, mask)]`` per global batch, in input order."""

    def reset(self) -> None:
        """Forgets the compiled loops (after the model was rebuilt)."""
        self._loops.clear()

    def is_out_of_memory(self, err: BaseException) -> bool:
        """Whether `err` says the device ran out of memory (then a smaller batch is
        tried): each engine names its errors. Defaults to False (nothing to run out of)."""
        return False

    def warn_if_untrained(self, doing: str) -> None:
        """Warns when the (built) model was never trained, restored or warm-started."""
        state = self._state
        if state.global_step or state.latest_checkpoint or state.warm_start_report:
            return
        logger.warning("fenwicks: %s a model that was never trained: %s holds no checkpoint, "
                       "so the weights are a random initialisation (step 0). Train first, or "
                       "give the work_dir of a trained run", doing, self.config.work_dir)

    def evaluate(self, input_fn: InputFn, steps: int | None) -> dict[str, float]:
        """Loss and metrics over every example of `input_fn` (see `Estimator.evaluate`)."""
        totals = self.with_smaller_batches(
            lambda global_batch: self._eval_totals(input_fn, global_batch, steps),
            self.config.eval_batch_size, "evaluation")
        self.warn_if_untrained("evaluated")
        _check_evaluation(totals.checks, totals.count, self._state.spec.model)
        if totals.count == 0:
            raise ValueError("the evaluation input_fn yielded no examples")
        if totals.weight == 0:
            raise ValueError("the evaluation's sample weights add up to 0; nothing to average")
        result: dict[str, float] = totals.means()
        result.update(global_step=self._state.global_step, num_examples=totals.count)
        write_eval_summary(self._state.summary_writer("eval"), self._state.global_step,
                           result, path=f"{self.config.work_dir}/eval")
        return result

    def check_single_host(self) -> None:
        """Prediction is single-host: a ValueError on a multi-worker run."""
        if self.config.num_processes > 1:
            raise ValueError(
                f"predict runs on one host, and this run spans {self.config.num_processes} "
                "workers (TF_CONFIG): each would return only its own share of the rows. "
                "Predict in a single-host process on the work_dir (a new estimator there "
                "restores the model), or export_saved_model and serve that")

    def predict(self, input_fn: InputFn) -> Any:
        """One row per example, in input order (see `Estimator.predict`)."""
        self.check_single_host()

        results = self.with_smaller_batches(
            lambda global_batch: self._predictions(input_fn, global_batch),
            self.config.predict_batch_size, "prediction")
        self.warn_if_untrained("predicted with")
        if not results:
            raise ValueError("the prediction input_fn yielded no examples")
        mask = np.concatenate([np.asarray(mask) for _, mask in results])
        flat = [np.concatenate([np.asarray(leaf) for leaf in leaves])[mask]
                for leaves in zip(*(keras.tree.flatten(p) for p, _ in results), strict=True)]
        return keras.tree.pack_sequence_as(results[0][0], flat)


def _num_classes(model: Any) -> str:
    try:
        return str(int(model.output_shape[-1]))
    except (AttributeError, TypeError, ValueError, IndexError):
        return "C"


def _check_evaluation(checks: dict[str, int], count: int, model: Any) -> None:
    """Bad evaluation data is an error, as in training, never a silent NaN or a skew."""
    labels, features = checks["labels_out_of_range"], checks["non_finite_features"]
    if labels or features:
        found = []
        if labels:
            found.append(f"{labels} class label(s) outside [0, {_num_classes(model)})")
        if features:
            found.append(f"{features} example(s) with NaN or infinite features")
        raise ValueError(
            f"the evaluation data has {' and '.join(found)}, of {count} examples; the "
            "loss and metrics would be NaN or wrong. Fix the evaluation input_fn (training "
            "checks its data the same way)")
    if checks["non_finite_loss"]:
        raise NonFiniteLossError(
            f"the evaluation loss is NaN or infinite for {checks['non_finite_loss']} of "
            f"{count} examples, whose inputs and labels are valid: the model's outputs "
            "overflow (train with a lower learning rate, or check the loss function)")
