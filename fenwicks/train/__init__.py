"""Training: the estimator, optimizers, schedules, the LR finder and callbacks.

    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=128)
    est.train_and_evaluate(train_input_func, eval_input_func, epochs=24)

How the estimator is put together (one object per job, as Orbit):

- `options.py`: `EstimatorConfig`, the typed, frozen, validated options.
- `estimator.py`: `Estimator`, the facade: builds the model from the input's probe and
  hands the parts to each other.
- `inputs.py`: input_fn to distributed iterators (params, probes and checks, the resume
  position, exact-evaluation padding); builds no model.
- `building.py`: the model and optimizer under the precision policy, and the checks of
  model against data (input shape, labels).
- `state.py`, `lock.py`: model, optimizer and counters, built once and restored from
  work_dir; the work_dir lock.
- `checkpointer.py`: `Checkpointer`, the one owner of a run's checkpoints (save, restore,
  wait, close), synchronous, asynchronous (`async_checkpoints.py`: host copies written
  by a background thread) or a non-chief worker's; `checkpoint_manager.py`: the compiled
  write and the keep-N books of a work_dir's checkpoints; `checkpoints.py`: what a
  checkpoint holds, its safe restore, damage and warm start.
- `save_policy.py`: `SavePolicy`, when to save (periodic, evaluation, SIGTERM, Ctrl-C,
  input exhausted, last loop, end): the one caller of `Checkpointer.save` (and `save_and_wait`).
- `trainer.py`: `Trainer`, the compiled inner loop (`loops.py`), used by the estimator
  and by `find_lr` (`lr_finder.py`).
- `controller.py`: the outer loop: how many steps, ``trainer.train(n)``, the actions;
  it builds each `train` call's one ordered action list (`default_actions`) and holds
  its `SavePolicy`. `train_and_evaluate` alternates its ``run.train`` and `evaluate`.
- `actions.py`, `conditions.py`, `progress.py`, `history.py`, `preemption.py`: the
  entries of that list (history, summaries, progress bar, the epoch log, the user's
  callbacks, non-finite-loss stop, preemption, periodic saves, epoch ends) and the
  conditions that trigger them; `callbacks.py`: Keras callbacks (`EarlyStopping`,
  `BestExporter`, `EpochLog`).
- `evaluation.py`: exact evaluation and prediction; `export.py`: SavedModel export.
- `model_func.py`, `optimizers.py`, `schedules.py`: what the user builds a run from.
- `engines.py`: the engine seam: the TensorFlow engine's roles (the modules above) or
  the JAX engine's (`jax/`: mesh, jitted steps, NumPy inputs, orbax checkpoints,
  trainer, evaluator), chosen by Keras's backend; everything else is shared.
  `cross_engine.py`: one engine's checkpoints read on the other (evaluate, predict and
  warm start; training there refused).
"""

from fenwicks.train.callbacks import BestExporter, EarlyStopping  # noqa: E402, F401
from fenwicks.train.checkpoints import (  # noqa: E402, F401  (public names)
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
from fenwicks.train.tpu_estimator import (  # noqa: E402, F401  (public names)
    EstimatorSpec,
    ModeKeys,
    RunConfig,
    TPUConfig,
    TPUEstimator,
    TPUEstimatorSpec,
    WarmStartSettings,
)
from fenwicks.train.tpu_ready import NotTPUReadyError, TPUReadiness, check_tpu_ready  # noqa: E402, F401, E501
