# %% [markdown]
# # Tutorial 3: the same code on a TPU, a GPU and the CPU
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 1 minute (the three settings train one after
#   another).
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   60 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# Fenwicks promises that one notebook trains on whatever accelerator is there. This
# tutorial opens the hood: it trains one small model under several `FENWICKS_DEVICE`
# settings and shows what differs underneath and what does not.
#
# | | TPU (v2/v3-8) | GPU | CPU |
# |---|---|---|---|
# | replicas | 8 cores | 1 per GPU | 1 (or `cpu:N` logical devices) |
# | strategy (TensorFlow engine) | `TPUStrategy` | `MirroredStrategy` | `OneDeviceStrategy` / `MirroredStrategy` |
# | precision (`'auto'`) | bfloat16 | float16 + loss scaling (compute capability >= 7) | float32 |
# | storage | `gs://` only (TPU node), local on a TPU VM | local | local |
# | BatchNorm statistics | per core: 1/8 of the batch | the whole batch | the whole batch |
#
# Variables stay float32 everywhere; only the arithmetic inside the layers changes.
#
# ## Two engines, one code
#
# Underneath, Keras runs on one of two engines. **TensorFlow** (`tf.distribute`
# strategies, as in the table; code of your own that needs one gets it from
# `fw.train.tf.strategy()`, while `fw.accel.current()` describes the devices only) is the
# default. **JAX** (`jax.sharding`: one mesh over every
# device, the global batch split across it) is what the 2026 Kaggle and Colab TPU images
# reach their TPUs with, so Fenwicks picks it there by itself; `FENWICKS_ENGINE=jax` (or
# `KERAS_BACKEND=jax`), set before `import fenwicks`, picks it anywhere. What changes in
# your code between the engines: nothing. The model, the optimiser, the input functions
# (still `tf.data`) and every estimator call are the same; checkpoints, compiled steps
# and device placement are the engine's business. Run this notebook with
# `FENWICKS_ENGINE=jax` and every setting below trains on JAX (`fw.info()` shows the
# engine): the same losses, up to float rounding.

# %% [markdown]
# ## Parameters
#
# `DEVICES` lists the settings to compare. `cpu:N` splits the CPU into N logical devices
# under `MirroredStrategy`: it behaves like N TPU cores sharing one global batch, which is
# how Fenwicks is tested without a TPU. Add `'auto'` on a GPU or TPU runtime to include
# the real accelerator.

# %% tags=["parameters"]
SMOKE = False          # True: a tiny run that finishes in seconds (the test suite sets it)
BATCH_SIZE = 256       # global batch size: the same for every device setting
EPOCHS = 4
LEARNING_RATE = 0.02   # SGD learning rate at BATCH_SIZE examples (loss averaged)
WEIGHT_DECAY = 5e-4
DEVICES = ['cpu:1', 'cpu:2', 'cpu:8']
GHOST_BN = 32          # BatchNorm group size; BATCH_SIZE / 8 makes 1 and 8 replicas agree
PARALLEL = False       # True: run all settings at once (faster; their speeds then compete)
SEED = 7

# %%
if SMOKE:
    BATCH_SIZE, EPOCHS, DEVICES, GHOST_BN, PARALLEL = 64, 1, ['cpu:1', 'cpu:2'], 32, True

# %% [markdown]
# ## Why a separate process per setting
#
# TensorFlow and JAX fix their devices when they start: a process that has seen one CPU
# cannot later split it into eight. So each setting trains in a fresh Python process, started
# with `FENWICKS_DEVICE` set. (For the same reason, this notebook does not touch the
# accelerator itself: on a TPU VM only one process at a time may hold the TPU.)
#
# The script below is ordinary Fenwicks code with nothing device-specific in it. It
# trains on scikit-learn's bundled 8x8 handwritten digits (no download) and prints one
# JSON line: what it ran on, the training history, the test metrics and the speed.

# %%
# %%writefile train_digits.py
import json
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import fenwicks as fw

cfg = json.loads(sys.argv[1])
X, y = load_digits(return_X_y=True)
X = (X.reshape(-1, 8, 8, 1) / 16.0).astype(np.float32)  # pixel values are 0..16
X_train, X_test, y_train, y_test = train_test_split(X, y.astype(np.int32), test_size=0.25,
                                                    random_state=0, stratify=y)


def build_nn(bn):
    model = fw.Sequential()
    model.add(fw.layers.ConvBN(16, bn=bn, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(32, bn=bn, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.GlobalPools2D())
    model.add(fw.layers.Classifier(10, weight=0.125))
    return model


def train(bn):
    """Trains a fresh model with BatchNorm mode `bn`; returns what happened."""
    work_dir = fw.io.get_project_dirs(None, 'devices')[1] + f"/{cfg['tag']}-bn{bn}"
    fw.io.create_clean_dir(work_dir)
    steps_per_epoch = len(X_train) // cfg['batch_size']
    opt_func = fw.train.sgd_optimizer(cfg['lr'], mom=0.9, wd=cfg['wd'])
    est = fw.train.get_tpu_estimator(
        steps_per_epoch, fw.train.get_clf_model_func(lambda: build_nn(bn), opt_func),
        work_dir, trn_bs=cfg['batch_size'], val_bs=200, seed=cfg['seed'], verbose=False)
    est.train(lambda params: fw.data.numpy_ds(
        X_train, y_train, params['batch_size'], training=True, seed=cfg['seed'],
        input_context=params.get('input_context')), steps=steps_per_epoch * cfg['epochs'])
    result = est.evaluate(lambda params: fw.data.numpy_ds(
        X_test, y_test, params['batch_size'], training=False,
        input_context=params.get('input_context')))
    speeds = [rate for _, rate in est.history.examples_per_sec]
    return {'steps': est.history.steps, 'losses': est.history.losses,
            'accuracy': float(result['accuracy']), 'examples_per_s': float(np.median(speeds))}


acc = fw.accel.current()
print(json.dumps({
    'engine': acc.engine, 'kind': acc.kind, 'replicas': acc.num_replicas,
    'precision': acc.precision,
    'per_replica_batch': cfg['batch_size'] // acc.num_replicas,
    'runs': {str(bn): train(bn) for bn in cfg['bns']}}))

# %% [markdown]
# ## Run it under each setting
#
# Same global batch, same seed, same data order. The only difference is how many
# replicas share each batch. Each process inherits this notebook's environment, and so
# its engine.

# %%
import json
import os
import subprocess
import sys


def start(device):
    """Starts train_digits.py with FENWICKS_DEVICE=device, for both BatchNorm modes."""
    cfg = dict(batch_size=BATCH_SIZE, epochs=EPOCHS, lr=LEARNING_RATE, wd=WEIGHT_DECAY,
               bns=[GHOST_BN, 'replica'], seed=SEED, tag=device.replace(':', ''))
    env = {**os.environ, 'FENWICKS_DEVICE': device, 'TF_CPP_MIN_LOG_LEVEL': '2'}
    return subprocess.Popen([sys.executable, 'train_digits.py', json.dumps(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(device, proc):
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f'{device} failed:\n{err[-3000:]}')
    return json.loads(out.strip().splitlines()[-1])


if PARALLEL:
    started = {device: start(device) for device in DEVICES}
    results = {device: finish(device, proc) for device, proc in started.items()}
else:  # one at a time: the speeds are then comparable
    results = {device: finish(device, start(device)) for device in DEVICES}
ghost = {device: r['runs'][str(GHOST_BN)] for device, r in results.items()}
for device, r in results.items():
    print(f"{device:>6}: {r['engine']} engine, {r['kind']} x{r['replicas']} ({r['precision']}), "
          f"{r['per_replica_batch']} examples per replica, test accuracy "
          f"{ghost[device]['accuracy']:.4f}, {ghost[device]['examples_per_s']:,.0f} examples/s")

# %% [markdown]
# ## The losses agree
#
# With ghost BatchNorm (`bn=GHOST_BN`), statistics are computed over fixed groups of
# `GHOST_BN` consecutive examples, however the batch is split. Dropout aside (there is
# none here), every replica count then computes the same function, and with the loss
# reduced over the *global* batch the updates are the same too: the curves coincide up
# to float rounding.

# %%
import matplotlib.pyplot as plt
import numpy as np


def curve(run):
    return run['steps'], run['losses']


fig, ax = plt.subplots(figsize=(6, 4))
for i, (device, run) in enumerate(ghost.items()):
    steps, losses = curve(run)
    replicas = results[device]['replicas']
    # Shrinking markers and different dashes, so curves that coincide stay visible.
    ax.plot(steps, losses, marker='o', markersize=9 - 3 * (i % 3),
            linestyle=['-', '--', ':'][i % 3], label=f'{device} ({replicas} replicas)')
ax.set_xlabel('step')
ax.set_ylabel('training loss')
ax.legend()
ax.grid(alpha=0.3)
plt.show()
reference = np.array(curve(ghost[DEVICES[0]])[1])
for device, run in ghost.items():
    diff = np.abs(np.array(curve(run)[1]) - reference).max()
    print(f"{device:>6}: max |loss - {DEVICES[0]} loss| = {diff:.2e}")

# %% [markdown]
# ## BatchNorm: the one place replicas differ by nature
#
# With the default `bn='replica'`, each replica normalises with the statistics of its own
# share of the batch: 32 examples per core on an 8-core TPU with batch 256, but all 256 on
# one GPU. Noisier statistics regularise a little, so the two runs are not the same model.
# The layers offer three modes:
#
# * `bn='replica'` (default): per replica, what Keras does;
# * `bn='sync'`: over the global batch, all-reduced across replicas (costs communication);
# * `bn=G` ("ghost"): over fixed groups of G examples. A GPU run with `bn=32` reproduces an
#   8-core TPU run with batch 256.
#
# Each process above also trained the model with per-replica statistics. Compared with the
# ghost-BatchNorm run on the same setting:

# %%
per_replica = {device: r['runs']['replica'] for device, r in results.items()}
for device, run in per_replica.items():
    diff = np.abs(np.array(curve(run)[1]) - np.array(curve(ghost[device])[1])).max()
    print(f"{device:>6}: test accuracy {run['accuracy']:.4f}; "
          f"max |loss - ghost-BN loss| = {diff:.2e}")

# %% [markdown]
# With one replica, per-replica statistics cover the whole batch (256 by default) while
# ghost groups cover 32: different numbers, a slightly different model. With 8 replicas
# each one holds 32 examples, exactly a ghost group, and the two modes coincide.
#
# ## Learning rate and weight decay when the batch size changes
#
# A TPU wants big batches (8 cores x 128 = 1024 is typical); a laptop CPU wants small
# ones. Two rules keep training comparable:
#
# * loss **averaged** over the batch (`reduction='mean'`): the gradient is an average, so
#   scale the learning rate linearly with the batch size (Goyal et al., 2017) and warm it up;
# * loss **summed** (`reduction='sum'`, tutorial 2): the gradient already grows with the
#   batch, so the learning rate is given per example (`lr / batch_size`) and coupled L2
#   weight decay is multiplied by the batch size to keep its pull equal.

# %%
print(f"{'batch':>6} | 'mean': lr | 'sum': lr per example, L2 weight decay")
for batch_size in (64, 256, 1024):
    print(f'{batch_size:6d} | {LEARNING_RATE * batch_size / BATCH_SIZE:10.4f} | '
          f'{LEARNING_RATE / BATCH_SIZE:.2e}, {WEIGHT_DECAY * batch_size:.4f}')

# %% [markdown]
# ## Storage
#
# A TPU *node* (Colab's older TPU runtime, anything reached through `TPU_NAME`) runs on
# another machine: it cannot read this VM's disk, so data and checkpoints must live in a
# `gs://` bucket. A TPU VM, a GPU and the CPU can use local disk.
# `fw.io.get_project_dirs(None, project)` chooses for you, and `fw.io.upload` stages local
# files to the bucket when a remote TPU needs them.

# %%
import fenwicks as fw

data_dir, work_dir = fw.io.get_project_dirs(None, 'devices')
print('data_dir:', data_dir)
print('work_dir:', work_dir)

# %% [markdown]
# Next: [Tutorial 4](04_augmentation_and_caching.ipynb) makes the input pipeline fast
# enough that the accelerator never waits.
