"""Serving inputs and SavedModel export of a model on one processor.

TF2 has no placeholders, so a ServingInputReceiver names its inputs with
tf.TensorSpecs; the exported "serving_default" signature takes one argument
per receiver tensor, by name.
"""

import os
import time

import tensorflow as tf


class ServingInputReceiver:
  """The inputs of a served model.

  Args:
    features: None (the model's features are the receiver tensors; a single
      receiver tensor named "input" is passed on as itself), or a callable
      from the dict of receiver tensors to the model's features.
    receiver_tensors: dict name -> tf.TensorSpec (or a single TensorSpec,
      named "input"). Shapes must be fully defined where the mtf graph
      needs them (e.g. its batch dimension).
    receiver_tensors_alternatives: accepted for compatibility; unused.
    postprocess: optional (predictions, receiver tensors) -> predictions,
      applied to what the model returns (e.g. to drop the rows that padded
      a request to the model's batch size).
  """

  def __init__(self, features, receiver_tensors,
               receiver_tensors_alternatives=None, postprocess=None):
    del receiver_tensors_alternatives
    if isinstance(receiver_tensors, tf.TensorSpec):
      receiver_tensors = {"input": receiver_tensors}
      self._single = True
    else:
      self._single = False
    if not isinstance(receiver_tensors, dict) or not receiver_tensors:
      raise ValueError("ServingInputReceiver receiver_tensors must be a "
                       f"non-empty dict of tf.TensorSpec, got "
                       f"{receiver_tensors!r}.")
    for name, spec in receiver_tensors.items():
      if not isinstance(spec, tf.TensorSpec):
        raise TypeError(f"ServingInputReceiver receiver tensor {name!r} must "
                        f"be a tf.TensorSpec, got {spec!r}.")
    if features is not None and not callable(features):
      raise TypeError("ServingInputReceiver features must be None or a "
                      f"callable of the receiver tensors, got {features!r}.")
    if postprocess is not None and not callable(postprocess):
      raise TypeError("ServingInputReceiver postprocess must be callable, "
                      f"got {postprocess!r}.")
    self.features = features
    self.receiver_tensors = dict(receiver_tensors)
    self.postprocess = postprocess

  def signature(self):
    """The receiver TensorSpecs, in name order, named after their keys."""
    return [tf.TensorSpec(spec.shape, spec.dtype, name=name)
            for name, spec in sorted(self.receiver_tensors.items())]

  def features_from(self, tensors):
    """The model's features from the dict of receiver tensors."""
    if self.features is not None:
      return self.features(tensors)
    if self._single:
      return tensors["input"]
    return tensors


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
  """A serving_input_receiver_fn taking `features` (dict name -> TensorSpec
  or tensor) as they are; `default_batch_size` fills an unknown leading
  dimension."""

  def spec_of(value):
    spec = tf.TensorSpec.from_tensor(value) if tf.is_tensor(value) else value
    shape = spec.shape
    if (default_batch_size is not None and shape.rank and
        tf.compat.dimension_value(shape[0]) is None):
      shape = tf.TensorShape([default_batch_size]).concatenate(shape[1:])
    return tf.TensorSpec(shape, spec.dtype)

  def serving_input_receiver_fn():
    if isinstance(features, dict):
      specs = {k: spec_of(v) for k, v in features.items()}
    else:
      specs = spec_of(features)
    return ServingInputReceiver(None, specs)

  return serving_input_receiver_fn


def save_serving_model(export_dir_base, predict_fn, receiver,
                       after_trace=None):
  """Saves "serving_default" = predict_fn(features) and the variables it
  reads (as plain tf.Variables). `after_trace()` runs once the variables
  exist (e.g. to check they were restored).

  The model is written into a temp directory and renamed to
  `export_dir_base/<timestamp>`, so an export directory is always complete.
  Returns the export directory (bytes, as tf.estimator did).
  """
  names = [spec.name for spec in receiver.signature()]

  def serve(*args):
    tensors = dict(zip(names, args))
    predictions = dict(predict_fn(receiver.features_from(tensors)))
    if receiver.postprocess is not None:
      predictions = dict(receiver.postprocess(predictions, tensors))
    return predictions

  module = tf.Module()
  module.serve = tf.function(serve, input_signature=receiver.signature())
  concrete = module.serve.get_concrete_function()
  if after_trace is not None:
    after_trace()
  # The slices the program reads, tracked so the SavedModel holds them.
  module.slice_variables = list(concrete.variables)
  tf.io.gfile.makedirs(export_dir_base)
  stamp = int(time.time())
  while tf.io.gfile.exists(os.path.join(export_dir_base, str(stamp))):
    stamp += 1
  final = os.path.join(export_dir_base, str(stamp))
  temp = os.path.join(export_dir_base, f"temp-{stamp}")
  tf.saved_model.save(module, temp, signatures={"serving_default": concrete})
  tf.io.gfile.rename(temp, final)
  return final.encode()
