"""Training: optimizers, schedules, the LR finder and the estimator. (Being built.)"""

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
