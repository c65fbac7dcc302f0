"""BERT's stand-in data for the run_classifier tests (tests/test_tpu_estimator.py,
tests/_bert_flows.py): a tiny config, random token-id TFRecords with PaddingInputExamples,
and a "pretrained" checkpoint of random values under BERT's TF1 names."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SEQ = 6
BERT_CONFIG = {"vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 16,
               "max_position_embeddings": 16, "type_vocab_size": 2}


def checkpoint_shapes(config):
    h, i = config["hidden_size"], config["intermediate_size"]
    shapes = {"bert/embeddings/word_embeddings": [config["vocab_size"], h],
              "bert/embeddings/token_type_embeddings": [config["type_vocab_size"], h],
              "bert/embeddings/position_embeddings": [config["max_position_embeddings"], h],
              "bert/embeddings/LayerNorm/gamma": [h], "bert/embeddings/LayerNorm/beta": [h],
              "bert/pooler/dense/kernel": [h, h], "bert/pooler/dense/bias": [h],
              "cls/predictions/output_bias": [config["vocab_size"]]}  # not in the classifier
    for layer in range(config["num_hidden_layers"]):
        prefix = f"bert/encoder/layer_{layer}/"
        for part, (n_in, n_out) in {"attention/self/query": (h, h),
                                    "attention/self/key": (h, h),
                                    "attention/self/value": (h, h),
                                    "attention/output/dense": (h, h),
                                    "intermediate/dense": (h, i),
                                    "output/dense": (i, h)}.items():
            shapes[prefix + part + "/kernel"] = [n_in, n_out]
            shapes[prefix + part + "/bias"] = [n_out]
        for part in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[prefix + part + "/gamma"] = [h]
            shapes[prefix + part + "/beta"] = [h]
    return shapes


def write_records(path, n_real, n_padding, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n_real + n_padding)
    # Learnable: each label draws its tokens from its own third of the vocabulary.
    ids = 3 + labels[:, None] * 9 + rng.integers(0, 9, (n_real + n_padding, SEQ))
    real = np.array([1] * n_real + [0] * n_padding)
    ids[n_real:], labels[n_real:] = 0, 0  # PaddingInputExample: all zeros, label 0

    def feature(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    with tf.io.TFRecordWriter(path) as writer:
        for i in range(len(ids)):
            example = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": feature(ids[i]), "input_mask": feature(ids[i] > 0),
                "segment_ids": feature([0] * SEQ), "label_ids": feature([labels[i]]),
                "is_real_example": feature([real[i]])}))
            writer.write(example.SerializeToString())
    return ids, labels, real


def write_name_based_checkpoint(prefix, tensors):
    """A TF1-style checkpoint (variables saved by name), as BERT's pretrained models."""
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    return prefix
