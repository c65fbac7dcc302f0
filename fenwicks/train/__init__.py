"""Training: optimizers, schedules, the LR finder and the estimator. (Being built.)"""

from fenwicks.train.checkpoints import CheckpointMismatchError  # noqa: E402, F401
from fenwicks.train.estimator import (  # noqa: E402, F401  (public names)
    Estimator,
    EstimatorConfig,
    History,
    NonFiniteLossError,
    get_tpu_estimator,
    train_and_evaluate,
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
