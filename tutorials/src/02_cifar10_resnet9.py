# %% [markdown]
# # Tutorial 2: CIFAR-10 with ResNet-9, the DAWNBench recipe
#
# **Run time**
#
# - Default size, on a 2-core CPU: about 4.5 hours (2,328 steps of a ResNet-9): use a
#   GPU or a TPU.
# - On a GPU or a TPU: not measured (none was available where this was written).
# - The `SMOKE` size (every cell, tiny data): set `SMOKE = True` in the Parameters cell:
#   62 s on a 2-core CPU shared with other jobs (the run shown on this tutorial's page in
#   the documentation).
#
# In 2018 David Page trained a 9-layer ResNet to 94% test accuracy on CIFAR-10 in 24
# epochs ("DavidNet", the fastest entry of Stanford's DAWNBench at the time). The recipe
# is a handful of ideas that each matter:
#
# * data in **TFRecords**, so a TPU can stream it from Cloud Storage;
# * **augmentation**: random crop after padding, horizontal flip, cutout;
# * the **one-cycle** learning rate: warm up linearly, then decay linearly to zero;
# * **SGD with Nesterov momentum and weight decay**, the loss **summed** over the batch.
#
# On a TPU or a recent GPU the full run takes minutes. With `SMOKE = True` it trains a
# narrow net for a few steps on a few hundred images, to check that every cell works.

# %% [markdown]
# ## Parameters
#
# The learning rate and weight decay are given the DAWNBench way. The loss is a *sum* over
# the batch, so the gradient grows with the batch size; the per-example learning rate is
# `LEARNING_RATE / BATCH_SIZE` and weight decay is multiplied by the batch size to keep
# its pull constant. Change `BATCH_SIZE` and both stay right.

# %% tags=["parameters"]
SMOKE = False           # True: a tiny run that finishes in seconds (the test suite sets it)
BATCH_SIZE = 512        # global batch size, split evenly over the replicas
EPOCHS = 24
LEARNING_RATE = 0.4     # peak learning rate per BATCH_SIZE examples (loss is summed)
WEIGHT_DECAY = 5e-4     # per example; scaled by BATCH_SIZE below
WARMUP_FRACTION = 5 / 24  # of the steps spent warming up
WIDTH = 64              # channels of the first layer; 64 is DavidNet
SEED = 42
PROJECT = 'cifar10'

# %%
N_TRAIN, N_TEST = None, None   # None: the whole split
if SMOKE:
    N_TRAIN, N_TEST, BATCH_SIZE, EPOCHS, WIDTH = 128, 64, 32, 1, 8

# %%
import os

import numpy as np

import fenwicks as fw

fw.info()
data_dir, work_dir = fw.io.get_project_dirs(None, PROJECT)
fw.io.create_clean_dir(work_dir)

# %% [markdown]
# ## Data: from tensorflow-datasets to TFRecords
#
# We read CIFAR-10 once into numpy and write it as TFRecord files. Why not feed numpy
# arrays as in tutorial 1? A TPU reached over the network runs the input pipeline on its
# own host, which can read only Cloud Storage: the data has to be files in a bucket.
# Several shards let several readers work in parallel. The images stay uint8 in the
# files: four times less to read, shuffle and cache than float32.

# %%
def load_split(split, limit=None):
    ds = fw.data.tfds_load('cifar10', split=split, as_supervised=True)
    if limit:
        ds = ds.take(limit)
    images, labels = next(ds.batch(100_000).as_numpy_iterator())
    return images, labels.astype(np.int32)


X_train, y_train = load_split('train', N_TRAIN)
X_test, y_test = load_split('test', N_TEST)
CLASSES = ['airplane', 'automobile', 'bird', 'cat', 'deer',
           'dog', 'frog', 'horse', 'ship', 'truck']
print(X_train.shape, X_test.shape)
fw.plt.plot_counts_pie(y_train, class_names=CLASSES)

# %%
train_fn = os.path.join(data_dir, 'train.tfrec')
test_fn = os.path.join(data_dir, 'test.tfrec')
fw.data.numpy_tfrecord(train_fn, X_train, y_train, num_shards=4, overwrite=True)
fw.data.numpy_tfrecord(test_fn, X_test, y_test, num_shards=1, overwrite=True)

# %% [markdown]
# Normalise with the training set's per-channel mean and standard deviation, computed
# once here, and keep those numbers: the same scaling must be applied at test time.

# %%
mean = X_train.reshape(-1, 3).mean(axis=0)
std = X_train.reshape(-1, 3).std(axis=0)
print('mean', mean.round(1), 'std', std.round(1))

# %% [markdown]
# ## Augmentation
#
# Three cheap transforms give the small net the variety of a much bigger dataset:
#
# * pad by 4 pixels and crop a random 32x32 window: the object moves a little;
# * flip left-right half of the time: a mirrored cat is still a cat;
# * cutout: blank a random 8x8 square, so the net cannot rely on one small patch.
#
# They run on whole batches (`batch_transform`), which is far cheaper than per example;
# tutorial 4 measures the difference.

# %%
normalize = fw.transform.tfm_standard_scaler(mean, std)


def augment(x):
    x = fw.transform.random_pad_crop(normalize(x), 4)
    x = fw.transform.random_flip(x)
    return fw.transform.cutout(x, 8, 8)


parser = lambda record: fw.data.tfexample_numpy_image_parser(record, 32, 32, 3)
train_input_func = lambda params: fw.data.tfrecord_ds(
    train_fn + '*', parser, batch_size=params['batch_size'], training=True,
    batch_transform=augment, seed=SEED, input_context=params.get('input_context'))
eval_input_func = lambda params: fw.data.tfrecord_ds(
    test_fn + '*', parser, batch_size=params['batch_size'], training=False,
    batch_transform=normalize, input_context=params.get('input_context'))

# %% [markdown]
# What the model will see: augmented training images, mapped back from normalised values
# for display.

# %%
fw.plt.show_batch(train_input_func, n=16, class_names=CLASSES,
                  converter=fw.transform.tfm_reverse_standard_scaler(mean, std))

# %% [markdown]
# ## ResNet-9
#
# `fw.models.resnet9` is DavidNet: a 3x3 conv, then three stages that each double the
# channels and halve the resolution, the first and third with a residual branch of two
# convs; global max pooling and a linear classifier finish it. The logits are scaled by
# 0.125, which keeps the early softmax soft and, with the summed loss, acts like a lower
# learning rate for the last layer. PyTorch's initialisation and BatchNorm settings are
# part of the recipe.

# %%
build_nn = lambda: fw.models.resnet9(n_classes=10, c=WIDTH)
build_nn().summary()

# %% [markdown]
# ## One-cycle learning rate, SGD with weight decay
#
# The learning rate climbs linearly for the first 5 of 24 epochs and then falls linearly
# to zero. The climb lets BatchNorm statistics and momentum settle before big steps; the
# long descent anneals into a good minimum without a separate fine-tuning phase.

# %%
steps_per_epoch = len(X_train) // BATCH_SIZE
total_steps = steps_per_epoch * EPOCHS
warmup_steps = int(WARMUP_FRACTION * total_steps)
lr_func = fw.train.one_cycle_lr(LEARNING_RATE / BATCH_SIZE, total_steps, warmup_steps,
                                fw.train.linear_decay())
fw.plt.plot_lr_func(lr_func, total_steps)

# %% [markdown]
# Weight decay here is classic L2 added to the gradient (coupled), as in the original
# PyTorch recipe, and Nesterov momentum 0.9. `reduction='sum'` makes the loss the sum over
# the global batch, whatever the number of replicas.

# %%
opt_func = fw.train.sgd_optimizer(lr_func, mom=0.9, wd=WEIGHT_DECAY * BATCH_SIZE)
model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='sum')
est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir,
                                 trn_bs=BATCH_SIZE, val_bs=1000, seed=SEED)

# %%
history = est.train_and_evaluate(train_input_func, eval_input_func, epochs=EPOCHS)
fw.plt.plot_history(history)

# %% [markdown]
# ## Evaluate
#
# Every test image counts once: the last partial batch is padded to a static shape (TPUs
# and XLA need one) and the padding masked out of the metrics. Expect about 94% after the
# full 24 epochs.

# %%
result = est.evaluate(eval_input_func)
print(f"test accuracy {result['accuracy']:.4f} after {result['global_step']} steps")

# %% [markdown]
# Next: [Tutorial 3](03_same_code_everywhere.ipynb) shows what changes underneath when
# the same code runs on a TPU, a GPU or the CPU.
