"""BERT's run_classifier main() with one of --do_train, --do_eval, --do_predict, as
written (google-research/bert run_classifier.py, main()'s estimator calls; the model_fn
from tests/_bert_run_classifier_port.py): ``python -m tests._bert_flows <root> <flag>``.

As main() does, ``num_train_steps`` and ``num_warmup_steps`` are None unless --do_train,
and --init_checkpoint is passed on every run. The data and the "pretrained" checkpoint
are tests/test_tpu_estimator.py's stand-ins, written under <root> by the first run.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import fenwicks as fw
from tests import _bert_data as t
from tests import _bert_modeling_port as modeling
from tests import _bert_run_classifier_port as run_classifier

TRAIN_BATCH, EVAL_BATCH, PREDICT_BATCH = 16, 8, 8
NUM_TRAIN_EXAMPLES, NUM_EPOCHS, WARMUP_PROPORTION = 64, 10.0, 0.1


def _files(root: str) -> dict:
    files = {"train": os.path.join(root, "train.tf_record"),
             "eval": os.path.join(root, "eval.tf_record"),
             "init_checkpoint": os.path.join(root, "bert_model.ckpt")}
    if not os.path.exists(files["train"]):
        rng = np.random.default_rng(7)
        pretrained = {name: rng.normal(size=shape).astype(np.float32) * 0.1
                      + (1.0 if name.endswith("gamma") else 0.0)
                      for name, shape in t.checkpoint_shapes(t.BERT_CONFIG).items()}
        t.write_name_based_checkpoint(files["init_checkpoint"], pretrained)
        t.write_records(files["train"], NUM_TRAIN_EXAMPLES, 0, seed=1)
    ids, labels, real = t.write_records(files["eval"], 21, 3, seed=2)  # padded to 24
    files["labels"], files["real"] = labels.tolist(), real.tolist()
    return files


def main(root: str, flag: str) -> dict:
    do_train, do_eval, do_predict = (flag == "do_train", flag == "do_eval",
                                     flag == "do_predict")
    files = _files(root)
    output_dir = os.path.join(root, "output")
    # main(), as written from here.
    bert_config = modeling.BertConfig.from_dict(t.BERT_CONFIG)
    is_per_host = fw.train.InputPipelineConfig.PER_HOST_V2
    run_config = fw.train.RunConfig(
        cluster=None, master=None, model_dir=output_dir, save_checkpoints_steps=10,
        tpu_config=fw.train.TPUConfig(iterations_per_loop=5, num_shards=8,
                                      per_host_input_for_training=is_per_host))
    num_train_steps = None
    num_warmup_steps = None
    if do_train:
        num_train_steps = int(NUM_TRAIN_EXAMPLES / TRAIN_BATCH * NUM_EPOCHS)
        num_warmup_steps = int(num_train_steps * WARMUP_PROPORTION)
    model_fn = run_classifier.model_fn_builder(
        bert_config=bert_config, num_labels=3, init_checkpoint=files["init_checkpoint"],
        learning_rate=3e-2, num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, use_tpu=True, use_one_hot_embeddings=True)
    estimator = fw.train.TPUEstimator(
        use_tpu=True, model_fn=model_fn, config=run_config, train_batch_size=TRAIN_BATCH,
        eval_batch_size=EVAL_BATCH, predict_batch_size=PREDICT_BATCH)
    out: dict = {"labels": files["labels"], "real": files["real"]}
    if do_train:
        train_input_fn = run_classifier.file_based_input_fn_builder(
            input_file=files["train"], seq_length=t.SEQ, is_training=True,
            drop_remainder=True)
        estimator.train(input_fn=train_input_fn, max_steps=num_train_steps)
    if do_eval:
        eval_steps = int(24 // EVAL_BATCH)  # use_tpu: whole batches of the padded file
        eval_input_fn = run_classifier.file_based_input_fn_builder(
            input_file=files["eval"], seq_length=t.SEQ, is_training=False,
            drop_remainder=True)
        result = estimator.evaluate(input_fn=eval_input_fn, steps=eval_steps)
        out["eval"] = {key: float(value) for key, value in result.items()}
    if do_predict:
        predict_input_fn = run_classifier.file_based_input_fn_builder(
            input_file=files["eval"], seq_length=t.SEQ, is_training=False,
            drop_remainder=True)
        out["probabilities"] = [p["probabilities"].tolist()
                                for p in estimator.predict(input_fn=predict_input_fn)]
    estimator.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
