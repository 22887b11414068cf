"""Training writes its loss to TensorBoard even when no loop holds a
multiple of save_summary_steps: the first loop of a run and its last
(partial) loop write their last loss, as T5's short fine-tuning needs."""

import numpy as np

from tests.estimator import toy_model


def _loss_events(directory):
  return toy_model.event_scalars(str(directory)).get("loss", {})


def _every_step_losses(tmp_path, steps):
  """{step: loss} of the same run summarized at every step."""
  reference = toy_model.make_estimator(tmp_path / "every_step",
                                       iterations_per_loop=1,
                                       save_summary_steps=1)
  reference.train(toy_model.input_fn, steps=steps)
  losses = _loss_events(tmp_path / "every_step")
  assert sorted(losses) == list(range(1, steps + 1))
  return losses


def test_runs_shorter_than_a_loop_and_last_partial_loops_write_the_loss(
    tmp_path):
  est = toy_model.make_estimator(tmp_path / "loops", iterations_per_loop=10,
                                 save_summary_steps=10)
  # Shorter than one loop and than save_summary_steps (fine-tuning).
  est.train(toy_model.input_fn, steps=3)
  assert sorted(_loss_events(tmp_path / "loops")) == [3]
  # Resumed: loops end at 13 (step 10 written by the step) and 16 (the
  # last, partial loop).
  est.train(toy_model.input_fn, steps=13)
  losses = _loss_events(tmp_path / "loops")
  assert sorted(losses) == [3, 10, 16]
  want = _every_step_losses(tmp_path, 16)
  np.testing.assert_allclose([losses[s] for s in (3, 10, 16)],
                             [want[s] for s in (3, 10, 16)], rtol=1e-5)


def test_middle_loops_keep_save_summary_steps(tmp_path):
  est = toy_model.make_estimator(tmp_path / "loops", iterations_per_loop=2,
                                 save_summary_steps=5)
  est.train(toy_model.input_fn, steps=9)  # Loops end at 2, 4, 6, 8 and 9.
  # The first loop, step 5 (written by the step), and the last loop; the
  # loops ending at 4 and 8 hold no multiple of 5 and write nothing.
  losses = _loss_events(tmp_path / "loops")
  assert sorted(losses) == [2, 5, 9]
  want = _every_step_losses(tmp_path, 9)
  np.testing.assert_allclose([losses[s] for s in (2, 5, 9)],
                             [want[s] for s in (2, 5, 9)], rtol=1e-5)
