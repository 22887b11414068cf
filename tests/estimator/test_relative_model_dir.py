"""A relative model_dir (e.g. --model_dir=run1) resumes like an absolute one:
the state file lists checkpoints relative to model_dir itself."""

import tensorflow as tf

from tests.estimator import toy_model


def test_relative_model_dir_resumes(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  toy_model.make_estimator("run").train(toy_model.input_fn, max_steps=2)
  state = tf.train.get_checkpoint_state("run")
  assert state.model_checkpoint_path.endswith("run/model.ckpt-2")
  est = toy_model.make_estimator("run")
  assert est.latest_checkpoint() is not None
  est.train(toy_model.input_fn, steps=1)
  assert est.get_variable_value("global_step") == 3
