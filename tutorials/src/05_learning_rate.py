# %% [markdown]
# # Tutorial 5: the learning rate
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 10 minutes (the finder's 100 steps, then 3
#   epochs per schedule), plus MNIST's download the first time.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   48 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# The learning rate is the hyperparameter that matters most: too small and training
# crawls, too large and it diverges. This tutorial
#
# 1. *finds* a good learning rate with the LR range test (`fw.train.find_lr`): train for a
#    few hundred steps while the rate grows exponentially, and watch where the loss falls
#    fastest and where it blows up;
# 2. compares two schedules at that rate on MNIST: **one-cycle** (warm up, then decay
#    linearly to zero) and **exponential decay**.

# %% [markdown]
# ## Parameters

# %% tags=["parameters"]
SMOKE = False          # True: a tiny run that finishes in seconds (the test suite sets it)
BATCH_SIZE = 512       # global batch size
EPOCHS = 3             # per schedule
LEARNING_RATE = None   # peak learning rate; None: take the LR finder's suggestion
WEIGHT_DECAY = 5e-4    # coupled L2 (SGD)
MIN_LR, MAX_LR = 1e-4, 10.0   # the range the finder sweeps
FINDER_STEPS = 100
WARMUP_FRACTION = 0.2  # of the one-cycle run spent warming up
SEED = 42

# %%
N_TRAIN, N_TEST, WIDTH = None, None, 32
if SMOKE:
    N_TRAIN, N_TEST, BATCH_SIZE, EPOCHS, FINDER_STEPS, WIDTH = 256, 128, 32, 1, 10, 8

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import fenwicks as fw

data_dir, work_dir = fw.io.get_project_dirs(None, 'learning_rate')


def load_split(split, limit=None):
    ds = fw.data.tfds_load('mnist', split=split, as_supervised=True)
    if limit:
        ds = ds.take(limit)
    images, labels = next(ds.batch(100_000).as_numpy_iterator())
    return (images / 255.0).astype(np.float32), labels.astype(np.int32)


X_train, y_train = load_split('train', N_TRAIN)
X_test, y_test = load_split('test', N_TEST)
train_input_func = lambda params: fw.data.numpy_ds(
    X_train, y_train, params['batch_size'], training=True, seed=SEED,
    input_context=params.get('input_context'))
eval_input_func = lambda params: fw.data.numpy_ds(
    X_test, y_test, params['batch_size'], training=False,
    input_context=params.get('input_context'))

# %% [markdown]
# The network of tutorial 1, ready-made in `fw.models`.

# %%
build_nn = lambda: fw.models.mnist_net(c=WIDTH)

# %% [markdown]
# ## The LR range test
#
# `find_lr` builds the model exactly as the estimator would (same replicas, precision and
# loss reduction) and trains it for `FINDER_STEPS` steps, multiplying the learning rate by
# a constant factor each step from `MIN_LR` to `MAX_LR`. It records the loss over the
# global batch and its smoothed version, stops once the loss has clearly diverged, and
# restores the initial weights: the real training starts from scratch.
#
# Read the plot from the left: flat (too small to matter), then a steep descent, a
# minimum, and an explosion. A good peak learning rate sits on the steep descent, about
# ten times below the minimum: the loss still falls fast there, with a margin before
# divergence.

# %%
# The optimizer's own learning rate does not matter: the finder replaces it by the sweep.
finder_opt = fw.train.sgd_optimizer(MIN_LR, mom=0.9, wd=WEIGHT_DECAY)
found = fw.train.find_lr(fw.train.get_clf_model_func(build_nn, finder_opt),
                         train_input_func, start_lr=MIN_LR, end_lr=MAX_LR,
                         num_steps=FINDER_STEPS, batch_size=BATCH_SIZE, seed=SEED)
fw.plt.plot_lr_find(found)

# %% [markdown]
# The red line is the finder's suggestion: where the smoothed loss falls fastest. If too
# few steps ran for a suggestion, take a tenth of the rate of the lowest loss, the other
# common rule.

# %%
peak_lr = LEARNING_RATE or found.suggestion or (found.min_loss_lr or 1.0) / 10
print(f'peak learning rate {peak_lr:.3g}; lowest loss at {found.min_loss_lr or 0:.3g}; '
      f'stopped early on divergence: {found.diverged}')

# %% [markdown]
# ## Two schedules at the same peak
#
# * **One-cycle** (Smith, 2018): warm up linearly to the peak, then decay linearly to
#   zero. The warm-up lets BatchNorm statistics and momentum settle before the large
#   steps; the high middle phase explores; the long decay settles into a minimum.
# * **Exponential decay**: start at the peak and multiply by a constant each step, here
#   down to 1% at the end. No warm-up, so the first steps are the riskiest.

# %%
steps_per_epoch = len(X_train) // BATCH_SIZE
total_steps = steps_per_epoch * EPOCHS
schedules = {
    'one-cycle': fw.train.one_cycle_lr(peak_lr, total_steps,
                                       int(WARMUP_FRACTION * total_steps),
                                       fw.train.linear_decay()),
    'exponential decay': fw.train.exp_decay_lr(init_lr=peak_lr, decay_steps=total_steps,
                                               decay_rate=0.01),
}
for name, lr_func in schedules.items():
    fig = fw.plt.plot_lr_func(lr_func, total_steps, title=name)
    display(fig)

# %% [markdown]
# Train the same network from the same initial weights (same seed) with each schedule,
# evaluating on the test set after every epoch.

# %%
histories = {}
for name, lr_func in schedules.items():
    opt_func = fw.train.sgd_optimizer(lr_func, mom=0.9, wd=WEIGHT_DECAY)
    run_dir = f"{work_dir}/{name.replace(' ', '_')}"
    fw.io.create_clean_dir(run_dir)
    est = fw.train.get_tpu_estimator(steps_per_epoch,
                                     fw.train.get_clf_model_func(build_nn, opt_func),
                                     run_dir, trn_bs=BATCH_SIZE, val_bs=BATCH_SIZE,
                                     seed=SEED)
    histories[name] = est.train_and_evaluate(train_input_func, eval_input_func,
                                             epochs=EPOCHS)

# %%
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
for name, history in histories.items():
    ax_loss.plot(history.steps, history.losses, label=name, alpha=0.8)
    ax_acc.plot(*history.metric('accuracy'), marker='o', label=name)
ax_loss.set(xlabel='step', ylabel='training loss', yscale='log')
ax_acc.set(xlabel='step', ylabel='test accuracy')
for ax in (ax_loss, ax_acc):
    ax.legend()
    ax.grid(alpha=0.3)
plt.show()
for name, history in histories.items():
    print(f"{name:>18}: test accuracy {history.evals[-1]['accuracy']:.4f}")

# %% [markdown]
# On short budgets one-cycle usually ends ahead: it spends most steps at a high rate and
# still ends at zero. Try `LEARNING_RATE` values around the suggestion (x0.3, x3) to see
# how forgiving each schedule is.
#
# Next: [Tutorial 6](06_weather_forecast.ipynb) forecasts the weather with a GRU.
