"""Calling input functions and splitting their elements."""

import inspect

import tensorflow as tf


def call_input_fn(input_fn, params):
  """input_fn(params) or input_fn(), as a tf.data.Dataset.

  A (features, labels) pair of tensors instead of a dataset is one batch,
  repeated.
  """
  if "params" in inspect.signature(input_fn).parameters:
    result = input_fn(params=params)
  else:
    result = input_fn()
  if isinstance(result, tf.data.Dataset):
    return result
  return tf.data.Dataset.from_tensors(result).repeat()


def split_element(element):
  """(features, labels) of a dataset element; labels None if absent."""
  if isinstance(element, tuple) and len(element) == 2:
    return element
  return element, None
