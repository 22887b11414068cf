"""ModeKeys: which of train, eval or infer a model function is built for."""


class ModeKeys:
  """The `mode` passed to a model function, with tf.estimator's values."""

  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"

  ALL = (TRAIN, EVAL, PREDICT)


def check_mode(mode):
  """Returns `mode` if it is one of ModeKeys.ALL, else raises ValueError."""
  if mode not in ModeKeys.ALL:
    raise ValueError(f"mode {mode!r} is not one of {ModeKeys.ALL}.")
  return mode
