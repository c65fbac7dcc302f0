"""Training: the estimator, optimizers, schedules, the LR finder and callbacks.

    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=128)
    est.train_and_evaluate(train_input_func, eval_input_func, epochs=24)
"""

from fenwicks.train.callbacks import BestExporter, EarlyStopping  # noqa: E402, F401
from fenwicks.train.checkpoints import (  # noqa: E402, F401  (public names)
    CheckpointCorruptError,
    CheckpointCoverageError,
    CheckpointMismatchError,
    CheckpointWriteError,
    ProbeWriteError,
)
from fenwicks.train.estimator import (  # noqa: E402, F401  (public names)
    Estimator,
    EstimatorConfig,
    History,
    NonFiniteLossError,
    get_tpu_estimator,
    train_and_evaluate,
)
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
from fenwicks.train.state import StorageUnavailableError  # noqa: E402, F401
from fenwicks.train.tpu_ready import NotTPUReadyError, TPUReadiness, check_tpu_ready  # noqa: E402, F401, E501
