"""The toy model's estimator in a TF1-style program (run as a subprocess).

Usage: python -m tests.estimator.tf1_worker WORK_DIR

Disables v2 behaviour before anything else, as the original's binaries did,
then, under WORK_DIR: trains "graph" for STEPS steps, resumes "eager" (which
the calling test trained eagerly) for RESUME_STEPS more, warm-starts "warm"
from "graph" for one step, evaluates, predicts (also under another mesh
and layout) and exports "graph" and serves the export with a TF1 loader,
trains and evaluates a TPUEstimator(use_tpu=False), and tries a SIMD mesh.
Writes what it saw to WORK_DIR/results.json.
"""

import json
import os
import sys

import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging
import numpy as np

from mesh_tensorflow import estimator
from tests import mtf_testing
from tests.estimator import toy_model

STEPS = toy_model.MODE_STEPS
RESUME_STEPS = toy_model.MODE_RESUME_STEPS


def train(model_dir, steps):
  """Trains the toy model `steps` more steps; {step: loop loss}."""
  recorder = toy_model.LossRecorder()
  toy_model.make_estimator(model_dir, **toy_model.MODE_SETTINGS).train(
      toy_model.input_fn, steps=steps, hooks=[recorder])
  return recorder.losses


def train_warm(model_dir, init_checkpoint):
  """Trains one step from `init_checkpoint` (RunConfig init_checkpoint)."""
  toy_model.make_estimator(model_dir, init_checkpoint=init_checkpoint,
                           **toy_model.MODE_SETTINGS).train(
                               toy_model.input_fn, steps=1)


def serve_tf1(export_dir):
  """The export's "out" for toy_model.INPUTS, through the TF1 loader."""
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(
        session, [tf.compat.v1.saved_model.tag_constants.SERVING], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    return session.run(signature.outputs["out"].name,
                       {signature.inputs["x"].name: toy_model.INPUTS})


def main(work_dir):
  logging.set_verbosity(logging.INFO)
  mtf_testing.configure_logical_devices()
  assert not tf.executing_eagerly()
  results = {"graph_losses": train(os.path.join(work_dir, "graph"), STEPS),
             "resumed_losses": train(os.path.join(work_dir, "eager"),
                                     RESUME_STEPS)}
  # Warm start (values by name, fed in the Session) from the run at STEPS.
  train_warm(os.path.join(work_dir, "warm"), os.path.join(work_dir, "graph"))
  est = toy_model.make_estimator(os.path.join(work_dir, "graph"),
                                 **toy_model.MODE_SETTINGS)
  results["evaluate"] = est.evaluate(toy_model.eval_input_fn)
  results["predict"] = np.stack(
      [p["out"] for p in est.predict(toy_model.predict_input_fn)]).tolist()
  # The same checkpoint restored under another mesh and layout.
  other = toy_model.make_estimator(os.path.join(work_dir, "graph"),
                                   mesh_shape="all:2", layout="hidden:all")
  results["predict_other_layout"] = np.stack(
      [p["out"] for p in other.predict(toy_model.predict_input_fn)]).tolist()
  receiver_fn = estimator.build_raw_serving_input_receiver_fn(
      {"x": tf.TensorSpec([toy_model.BATCH, toy_model.IO], tf.float32)})
  export_dir = est.export_saved_model(os.path.join(work_dir, "export"),
                                      receiver_fn).decode()
  results["export_dir"] = export_dir
  results["served"] = serve_tf1(export_dir).tolist()

  tpu = estimator.TPUEstimator(
      toy_model.model_fn, use_tpu=False, train_batch_size=toy_model.BATCH,
      config=estimator.RunConfig(model_dir=os.path.join(work_dir, "tpu"),
                                 mesh_shape="all:2", layout="batch:all"),
      params={"learning_rate": 0.1})
  tpu.train(toy_model.input_fn, steps=4)
  results["tpu_evaluate"] = tpu.evaluate(toy_model.eval_input_fn)

  simd = toy_model.make_estimator(os.path.join(work_dir, "simd"),
                                  mesh_impl="simd")
  try:
    simd.train(toy_model.input_fn, steps=1)
    results["simd_error"] = None
  except ValueError as e:
    results["simd_error"] = str(e)
  with open(os.path.join(work_dir, "results.json"), "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(sys.argv[1])
