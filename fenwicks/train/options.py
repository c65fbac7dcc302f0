"""The estimator's options: one frozen, typed dataclass, validated once when it is made.

A leaf module (it imports nothing of `fenwicks.train`), so the parts of a run read the
same typed object: `RunState`, the input side (`InputManager`), the `Evaluator`, the
`Controller` and the default actions and callbacks. The `Trainer` does not: the
controller hands it the few values its compiled loop needs (batch size, jit_compile).
Per-replica batch sizes are derived here, once.
Each check is one of the shared validators in `fenwicks._checks`, and each error names
the argument as the user wrote it (``trn_bs``, not ``train_batch_size``).
"""

from __future__ import annotations

import dataclasses

from fenwicks import _checks

# Concrete precisions: 'auto' is resolved by `get_tpu_estimator` before options are made.
PRECISIONS = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class EstimatorConfig:
    """Validated options of `get_tpu_estimator` (see there for each one's meaning).

    Batch sizes are global (all replicas together); the ``*_per_replica`` properties
    give what each replica, and an input_fn's ``params['batch_size']``, sees.

    Raises:
        ValueError: an option out of range, named as `get_tpu_estimator`'s argument.

    Examples:
        >>> config = EstimatorConfig(steps_per_epoch=100, work_dir='/tmp/run',
        ...                          train_batch_size=512, eval_batch_size=512,
        ...                          predict_batch_size=512, steps_per_loop=100,
        ...                          precision='float32', num_replicas=8)
        >>> config.train_batch_per_replica
        64
    """

    steps_per_epoch: int
    work_dir: str
    train_batch_size: int
    eval_batch_size: int
    predict_batch_size: int
    steps_per_loop: int
    precision: str
    seed: int | None = None
    warm_start_from: str | None = None
    jit_compile: bool = False
    save_every_secs: float | None = 600.0
    save_every_loops: int | None = None
    keep_checkpoints: int = 3
    verbose: bool = True
    async_checkpoints: bool = True
    # The engine's counts (`Engine.num_replicas`, `num_processes`), read once by
    # `get_tpu_estimator`: every shared reader (input params, exact evaluation's padding,
    # out-of-memory halving, check_input, check_tpu_ready, the TPUEstimator) reads these.
    num_replicas: int = 1
    num_processes: int = 1

    def __post_init__(self) -> None:
        replicas = _checks.positive_int("num_replicas", self.num_replicas)
        checked = {
            "num_processes": _checks.positive_int("num_processes", self.num_processes),
            "steps_per_epoch": _checks.positive_int("steps_per_epoch", self.steps_per_epoch),
            "work_dir": _checks.path_arg("work_dir", self.work_dir).rstrip("/"),
            "train_batch_size": _checks.divisible_by_replicas(
                "trn_bs", self.train_batch_size, replicas),
            "eval_batch_size": _checks.divisible_by_replicas(
                "val_bs", self.eval_batch_size, replicas),
            "predict_batch_size": _checks.divisible_by_replicas(
                "pred_bs", self.predict_batch_size, replicas),
            "steps_per_loop": _checks.positive_int("steps_per_loop", self.steps_per_loop),
            "precision": _checks.one_of("precision", self.precision, PRECISIONS),
            "warm_start_from": None if self.warm_start_from is None else _checks.path_arg(
                "warm_start_from", self.warm_start_from),
            "jit_compile": _checks.boolean("jit_compile", self.jit_compile),
            "save_every_secs": _checks.non_negative_number(
                "save_every_secs", self.save_every_secs, allow_none=True),
            "save_every_loops": _checks.positive_int(
                "save_every_loops", self.save_every_loops, allow_none=True),
            "keep_checkpoints": _checks.positive_int("keep_checkpoints",
                                                     self.keep_checkpoints),
            "verbose": _checks.boolean("verbose", self.verbose),
            "async_checkpoints": _checks.boolean("async_checkpoints", self.async_checkpoints),
            "seed": _checks.seed(self.seed),
        }
        for name, value in checked.items():  # normalised (int, float, str); still frozen
            object.__setattr__(self, name, value)

    @property
    def train_batch_per_replica(self) -> int:
        """Training examples per replica per step: ``params['batch_size']`` in training."""
        return self.train_batch_size // self.num_replicas

    @property
    def eval_batch_per_replica(self) -> int:
        """Evaluation examples per replica per step."""
        return self.eval_batch_size // self.num_replicas

    @property
    def predict_batch_per_replica(self) -> int:
        """Prediction examples per replica per step."""
        return self.predict_batch_size // self.num_replicas
