"""Training: the estimator, optimizers and schedules, callbacks, the LR finder, and
TPUEstimator's front door for TF1 programs.

    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=128)
    est.train_and_evaluate(train_input_func, eval_input_func, epochs=24)

Start with `get_tpu_estimator` (or `Estimator` with an `EstimatorConfig`), a model
function from `get_clf_model_func`, and an optimizer from `sgd_optimizer` or
`adam_optimizer` with a learning-rate schedule.
"""

import importlib
from typing import TYPE_CHECKING, Any

from fenwicks.train.callbacks import BestExporter, EarlyStopping  # noqa: E402, F401
from fenwicks.train.checkpointing import (  # noqa: E402, F401  (public names)
    CheckpointCorruptError,
    CheckpointCoverageError,
    CheckpointMismatchError,
    CheckpointWriteError,
    ProbeWriteError,
)
from fenwicks.train.cross_engine import (  # noqa: E402, F401  (public names)
    CrossEngineMismatchError,
)
from fenwicks.train.estimator import (  # noqa: E402, F401  (public names)
    Estimator,
    EstimatorConfig,
    History,
    NonFiniteLossError,
    get_tpu_estimator,
    train_and_evaluate,
)
from fenwicks.train.export_dirs import ExportError, latest_export  # noqa: E402, F401  (public names)
from fenwicks.train.input_check import InputVerdict  # noqa: E402, F401  (public name)
from fenwicks.train.lock import (  # noqa: E402, F401  (public names)
    WorkDirLockedError,
    WorkDirNotWritableError,
)
from fenwicks.train.lr_finder import (  # noqa: E402, F401  (public names)
    ExponentialSweep,
    LRFinderResult,
    find_lr,
)
from fenwicks.train.model_func import (  # noqa: E402, F401  (public names)
    ModelSpec,
    absolute_error,
    accuracy,
    get_clf_model_func,
    get_model_func,
    get_reg_model_func,
    sparse_softmax_cross_entropy,
    squared_error,
)
from fenwicks.train.optimizers import (  # noqa: E402, F401  (public names)
    BN_AND_BIAS,
    SGD,
    AdamW,
    adam_optimizer,
    sgd_optimizer,
)
from fenwicks.train.preemption import Interrupted, Preempted  # noqa: E402, F401
from fenwicks.train.run_state import StorageUnavailableError  # noqa: E402, F401
from fenwicks.train.schedules import (  # noqa: E402, F401  (public names)
    Constant,
    CosineDecay,
    ExpDecay,
    FunctionSchedule,
    Join,
    LinearDecay,
    PiecewiseLinear,
    Scaled,
    Schedule,
    Warmup,
    cosine_decay,
    exp_decay_lr,
    linear_decay,
    linear_warmup,
    one_cycle_lr,
    one_cycle_momentum,
    piecewise_linear,
)
from fenwicks.train.tpu_ready import NotTPUReadyError, TPUReadiness, check_tpu_ready  # noqa: E402, F401

# The public names, as the API reference lists them.
__all__ = [
    "absolute_error", "accuracy", "adam_optimizer", "AdamW", "BestExporter", "BN_AND_BIAS",
    "check_tpu_ready", "CheckpointCorruptError", "CheckpointCoverageError",
    "CheckpointMismatchError", "CheckpointWriteError", "Constant", "cosine_decay",
    "CosineDecay", "CrossEngineMismatchError", "EarlyStopping",
    "Estimator", "EstimatorConfig", "EstimatorSpec", "exp_decay_lr", "ExpDecay",
    "ExponentialSweep", "ExportError", "find_lr", "FunctionSchedule", "get_clf_model_func",
    "get_model_func", "get_reg_model_func", "get_tpu_estimator", "History", "InputVerdict",
    "Interrupted", "Join", "latest_export", "linear_decay", "linear_warmup", "LinearDecay",
    "LRFinderResult",
    "ModeKeys", "ModelSpec", "NonFiniteLossError", "NotTPUReadyError", "one_cycle_lr",
    "one_cycle_momentum", "piecewise_linear", "PiecewiseLinear", "Preempted",
    "ProbeWriteError", "RunConfig", "Scaled", "Schedule", "SGD", "sgd_optimizer",
    "sparse_softmax_cross_entropy", "squared_error", "StorageUnavailableError", "TPUConfig",
    "TPUEstimator", "TPUEstimatorSpec", "TPUReadiness", "train_and_evaluate",
    "WarmStartSettings", "Warmup", "WorkDirLockedError", "WorkDirNotWritableError",
]

# TPUEstimator's names: module -> names, imported on first use (PEP 562).
_TF1_NAMES = {
    "fenwicks.train.tf.tf1_config": ("EstimatorSpec", "InputPipelineConfig", "ModeKeys",
                                     "RunConfig", "TPUConfig", "TPUEstimatorSpec",
                                     "WarmStartSettings"),
    "fenwicks.train.tf.tpu_estimator": ("TPUEstimator",),
}
_TF1_MODULE = {name: module for module, names in _TF1_NAMES.items() for name in names}

if TYPE_CHECKING:  # for type checkers and the API reference, which read imports
    from fenwicks.train.tf.tf1_config import (  # noqa: F401
        EstimatorSpec,
        InputPipelineConfig,
        ModeKeys,
        RunConfig,
        TPUConfig,
        TPUEstimatorSpec,
        WarmStartSettings,
    )
    from fenwicks.train.tf.tpu_estimator import TPUEstimator  # noqa: F401


def __getattr__(name: str) -> Any:
    """TPUEstimator's names, imported when first used. ``TPUEstimator`` asks the engine
    first: one that cannot run a TF1 model_fn (jax) gets a class that refuses in one
    sentence at construction, and no TF1 code is imported."""
    if name == "tf":  # the tf engine's package (fw.train.tf.strategy()), on any engine
        return importlib.import_module("fenwicks.train.tf")
    module = _TF1_MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'fenwicks.train' has no attribute {name!r}")
    if name == "TPUEstimator":
        from fenwicks.train import engines

        refusal = engines.current().tf1_model_fn_refusal()
        if refusal:
            return _refused_tpu_estimator(refusal)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TF1_MODULE))


def _refused_tpu_estimator(refusal: str) -> type:
    class TPUEstimator:
        """fw.train.TPUEstimator on an engine that cannot run a TF1 model_fn: its
        constructor raises the engine's one-sentence refusal."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ValueError(refusal)

    return TPUEstimator
