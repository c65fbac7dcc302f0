"""Training: the estimator, optimizers and schedules, callbacks, the LR finder, and
TPUEstimator's front door for TF1 programs.

    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=128)
    est.train_and_evaluate(train_input_func, eval_input_func, epochs=24)

Start with `get_tpu_estimator` (or `Estimator` with an `EstimatorConfig`), a model
function from `get_clf_model_func`, and an optimizer from `sgd_optimizer` or
`adam_optimizer` with a learning-rate schedule.
"""

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
    CrossEngineTrainingError,
)
from fenwicks.train.estimator import (  # noqa: E402, F401  (public names)
    Estimator,
    EstimatorConfig,
    History,
    NonFiniteLossError,
    get_tpu_estimator,
    train_and_evaluate,
)
from fenwicks.train.export_dirs import ExportError  # noqa: E402, F401  (public name)
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
from fenwicks.train.tpu_estimator import (  # noqa: E402, F401  (public names)
    EstimatorSpec,
    InputPipelineConfig,
    ModeKeys,
    RunConfig,
    TPUConfig,
    TPUEstimator,
    TPUEstimatorSpec,
    WarmStartSettings,
)
from fenwicks.train.tpu_ready import NotTPUReadyError, TPUReadiness, check_tpu_ready  # noqa: E402, F401

# The public names, as the API reference lists them.
__all__ = [
    "absolute_error", "accuracy", "adam_optimizer", "AdamW", "BestExporter", "BN_AND_BIAS",
    "check_tpu_ready", "CheckpointCorruptError", "CheckpointCoverageError",
    "CheckpointMismatchError", "CheckpointWriteError", "Constant", "cosine_decay",
    "CosineDecay", "CrossEngineMismatchError", "CrossEngineTrainingError", "EarlyStopping",
    "Estimator", "EstimatorConfig", "EstimatorSpec", "exp_decay_lr", "ExpDecay",
    "ExponentialSweep", "ExportError", "find_lr", "FunctionSchedule", "get_clf_model_func",
    "get_model_func", "get_reg_model_func", "get_tpu_estimator", "History", "InputVerdict",
    "Interrupted", "Join", "linear_decay", "linear_warmup", "LinearDecay", "LRFinderResult",
    "ModeKeys", "ModelSpec", "NonFiniteLossError", "NotTPUReadyError", "one_cycle_lr",
    "one_cycle_momentum", "piecewise_linear", "PiecewiseLinear", "Preempted",
    "ProbeWriteError", "RunConfig", "Scaled", "Schedule", "SGD", "sgd_optimizer",
    "sparse_softmax_cross_entropy", "squared_error", "StorageUnavailableError", "TPUConfig",
    "TPUEstimator", "TPUEstimatorSpec", "TPUReadiness", "train_and_evaluate",
    "WarmStartSettings", "Warmup", "WorkDirLockedError", "WorkDirNotWritableError",
]
