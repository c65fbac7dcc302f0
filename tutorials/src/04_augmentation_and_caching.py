# %% [markdown]
# # Tutorial 4: data augmentation and cached datasets
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 2 minutes, plus CIFAR-10's download (162 MiB)
#   the first time.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   32 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# A TPU v3-8 trains ResNet-9 on tens of thousands of CIFAR-10 images per second. The
# host that feeds it (in Colab, a VM with two CPU cores) must read, decode, augment and
# batch images at least that fast, or the accelerator sits idle. This tutorial measures
# the input pipeline and shows three ways to speed it up:
#
# 1. augment whole **batches** with vectorised ops instead of one example at a time;
# 2. **cache** the decoded records, so files are read and parsed once;
# 3. **pre-augment** a few epochs once and cycle through them, when even vectorised
#    augmentation is too slow for the host.

# %% [markdown]
# ## Parameters

# %% tags=["parameters"]
SMOKE = False          # True: a tiny run that finishes in seconds (the test suite sets it)
BATCH_SIZE = 512       # global batch size
EPOCHS = 4             # for the short training run at the end
LEARNING_RATE = 0.4    # peak learning rate per BATCH_SIZE examples (loss summed, as in tutorial 2)
WEIGHT_DECAY = 5e-4    # per example
N_TRAIN = 10_000       # examples used for the measurements
MEASURE_BATCHES = 40   # batches timed per pipeline
AUGMENTED_EPOCHS = 4   # epochs pre-augmented and cached in the last variant
SEED = 42
PROJECT = 'augmentation'

# %%
if SMOKE:
    BATCH_SIZE, EPOCHS, N_TRAIN, MEASURE_BATCHES, AUGMENTED_EPOCHS = 32, 1, 128, 4, 2

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf

import fenwicks as fw

data_dir, work_dir = fw.io.get_project_dirs(None, PROJECT)
fw.io.create_clean_dir(work_dir)  # deletes only what an earlier run of Fenwicks wrote
cache_dir = fw.io.create_clean_dir(work_dir + '_cache', force=True)  # tf.data's cache files

# %% [markdown]
# ## The data, as TFRecords
#
# The same CIFAR-10 TFRecords as tutorial 2 (here a subset), uint8 images.

# %%
ds = fw.data.tfds_load('cifar10', split='train', as_supervised=True).take(N_TRAIN)
X_train, y_train = next(ds.batch(N_TRAIN).as_numpy_iterator())
train_fn = os.path.join(data_dir, 'train.tfrec')
fw.data.numpy_tfrecord(train_fn, X_train, y_train.astype(np.int32), num_shards=4,
                       overwrite=True)
mean = X_train.reshape(-1, 3).mean(axis=0)
std = X_train.reshape(-1, 3).std(axis=0)
parser = lambda record: fw.data.tfexample_numpy_image_parser(record, 32, 32, 3)

# %% [markdown]
# ## Per example versus vectorised
#
# The functions in `fw.transform` accept one image `[H, W, C]` or a batch `[B, H, W, C]`.
# Given a batch, `random_pad_crop` draws B offsets and crops them all in one op, `cutout`
# builds B masks at once. Mapped per example (`transform=`), the same work costs one small
# op per image, and tf.data's per-element overhead dominates.

# %%
def augment(x):
    x = fw.transform.standard_scaler(x, mean, std)
    x = fw.transform.random_pad_crop(x, 4)
    x = fw.transform.random_flip(x)
    return fw.transform.cutout(x, 8, 8)


def measure(ds, batches=MEASURE_BATCHES):
    """Examples per second over `batches` batches, after one warm-up batch."""
    it = iter(ds)
    next(it)  # the first batch pays for tracing and filling buffers
    start = time.perf_counter()
    n = sum(int(tf.shape(next(it)[0])[0]) for _ in range(batches))
    return n / (time.perf_counter() - start)


pipelines = {
    'per example': lambda: fw.data.tfrecord_ds(
        train_fn + '*', parser, BATCH_SIZE, transform=augment, seed=SEED),
    'vectorised': lambda: fw.data.tfrecord_ds(
        train_fn + '*', parser, BATCH_SIZE, batch_transform=augment, seed=SEED),
    'vectorised + cache': lambda: fw.data.tfrecord_ds(
        train_fn + '*', parser, BATCH_SIZE, batch_transform=augment, cache=True, seed=SEED),
}
speed = {name: measure(make()) for name, make in pipelines.items()}
for name, examples_per_s in speed.items():
    print(f'{name:>20}: {examples_per_s:9,.0f} examples/s')

# %% [markdown]
# ## Pre-augmented epochs
#
# With `augmented_epochs=K`, the pipeline augments K epochs once, caches them (in memory
# with `cache=True`, or in a file, local or `gs://`, with `cache='path'`) and then cycles
# through them: epoch K+1 sees exactly the augmented batches of epoch 1. Reading a cache
# costs almost nothing, so this is as fast as a pipeline can be; the price is less variety
# (K different augmentations of each image instead of one per epoch), and K = 4 to 8 is
# usually enough for the short runs of these tutorials.

# %%
cache_file = os.path.join(cache_dir, 'augmented')
pre_augmented = lambda: fw.data.tfrecord_ds(
    train_fn + '*', parser, BATCH_SIZE, batch_transform=augment, seed=SEED,
    augmented_epochs=AUGMENTED_EPOCHS, cache=cache_file)
steps_per_epoch = len(X_train) // BATCH_SIZE
it = iter(pre_augmented())
for _ in range(steps_per_epoch * AUGMENTED_EPOCHS + 1):
    next(it)  # the first K epochs write the cache; one batch more closes it
del it
speed['pre-augmented, cached'] = measure(pre_augmented())
print(f"{'pre-augmented, cached':>20}: {speed['pre-augmented, cached']:9,.0f} examples/s")

# %%
fig, ax = plt.subplots(figsize=(7, 3))
ax.barh(list(speed), list(speed.values()))
ax.set_xlabel('examples / s (higher is better)')
ax.set_title(f'Input pipeline speed on this host, batch {BATCH_SIZE}')
plt.show()

# %% [markdown]
# Compare these numbers with the speed of the accelerator (tutorial 8 measures it): if
# the pipeline is slower, the accelerator waits, and a faster model buys nothing. After
# training, `est.check_input(input_fn)` makes that comparison for you (tutorial 1): it
# times the input as training reads it against the examples/s the last `train` consumed,
# and prints the verdict with the fixes that apply.
#
# ## What the model sees
#
# Always look at augmented images: a crop that cuts off the object or a cutout larger
# than the object teaches the model noise.

# %%
fw.plt.show_batch(pre_augmented(), n=16,
                  converter=fw.transform.tfm_reverse_standard_scaler(mean, std))

# %% [markdown]
# ## Training on the cached pipeline
#
# The estimator does not care where batches come from: the input function returns the
# pre-augmented dataset, reading the cache written above. A short run of the tutorial-2
# recipe with a narrow ResNet:

# %%
def build_nn():
    c = 16 if SMOKE else 32
    model = fw.Sequential()
    model.add(fw.layers.ConvBN(c, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvResBlk(c * 2, res_convs=2, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvBlk(c * 4, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.GlobalPools2D())
    model.add(fw.layers.Classifier(10, weight=0.125))
    return model


total_steps = steps_per_epoch * EPOCHS
lr_func = fw.train.one_cycle_lr(LEARNING_RATE / BATCH_SIZE, total_steps,
                                max(1, total_steps // 5), fw.train.linear_decay())
opt_func = fw.train.sgd_optimizer(lr_func, mom=0.9, wd=WEIGHT_DECAY * BATCH_SIZE)
est = fw.train.get_tpu_estimator(
    steps_per_epoch, fw.train.get_clf_model_func(build_nn, opt_func, reduction='sum'),
    work_dir + '/model', trn_bs=BATCH_SIZE, val_bs=BATCH_SIZE, seed=SEED)
est.train(lambda params: fw.data.tfrecord_ds(
    train_fn + '*', parser, params['batch_size'], batch_transform=augment, seed=SEED,
    augmented_epochs=AUGMENTED_EPOCHS, cache=cache_file + f"-{params['batch_size']}",
    input_context=params.get('input_context')), steps=total_steps)
fw.plt.plot_history(est.history)

# %% [markdown]
# The cache file name includes the per-replica batch size: a cache holds batches of one
# size, and the estimator's input function may run with a different one than the
# measurements above.
#
# Next: [Tutorial 5](05_learning_rate.ipynb) finds a good learning rate and compares
# schedules.
