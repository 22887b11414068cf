"""BERT's optimizer: a warm-up and linear-decay learning rate, Adam with
decoupled weight decay (or Adafactor), and global-norm gradient clipping.

The learning rate is a TF scalar computed from TF's global step, which the
estimator makes the loop's step while it builds the model function
(`mesh_tensorflow.global_step`); in `tf.compat.v1` graph mode it is the
graph's global step. It is imported into the mtf graph once per step.
"""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import global_step as global_step_lib
from mesh_tensorflow import optimize as mtf_optimize

# Variables whose names match any of these get no weight decay.
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def clip_by_global_norm(grads, clip_norm):
  """Scales `grads` so that their global norm is at most `clip_norm`.

  Args:
    grads: a list of mtf Tensors (None entries are kept as None).
    clip_norm: a number or an mtf scalar.

  Returns:
    (clipped grads, global norm): the grads times
    clip_norm / max(global_norm, clip_norm).
  """
  squares = [mtf.reduce_sum(mtf.square(g)) for g in grads if g is not None]
  global_norm = mtf.sqrt(mtf.add_n(squares))
  multiplier = clip_norm / mtf.maximum(global_norm, clip_norm)
  clipped = [None if g is None else g * multiplier for g in grads]
  return clipped, global_norm


def learning_rate_schedule(global_step, init_lr, num_train_steps,
                           num_warmup_steps):
  """init_lr * step / num_warmup_steps while step < num_warmup_steps, then
  init_lr * (1 - min(step, num_train_steps) / num_train_steps): a float32
  TF scalar.
  """
  step = tf.cast(global_step, tf.float32)
  # Linear decay to 0 at num_train_steps (tf.compat.v1's polynomial_decay
  # with power 1, without cycling).
  done = tf.minimum(step, float(num_train_steps)) / float(
      max(num_train_steps, 1))
  learning_rate = init_lr * (1.0 - done)
  if num_warmup_steps:
    warmup_rate = init_lr * step / float(num_warmup_steps)
    is_warmup = tf.cast(step < float(num_warmup_steps), tf.float32)
    learning_rate = (1.0 - is_warmup) * learning_rate + (
        is_warmup * warmup_rate)
  return learning_rate


def create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps,
                     max_optimized_variable_size=None,
                     optimizer="adam",
                     clip_gradients=True):
  """The update operations of one training step on `loss`.

  Args:
    loss: a scalar mtf Tensor.
    init_lr: the peak learning rate (None or 0: Adafactor's own schedule;
      Adam needs one).
    num_train_steps: the learning rate reaches 0 at this step.
    num_warmup_steps: the learning rate rises linearly from 0 to init_lr
      over these steps.
    max_optimized_variable_size: if set, only variables with at most this
      many elements are trained (the others stay as they are).
    optimizer: "adam" (AdamWeightDecayOptimizer: weight decay 0.01, betas
      0.9 / 0.999, epsilon 1e-6, no decay for LayerNorm / layer_norm / bias
      variables) or "adafactor".
    clip_gradients: clip the gradients to global norm 1.0 (as BERT was
      pretrained).

  Returns:
    (learning_rate, update_ops): the TF scalar learning rate (None without
    init_lr) and the mtf assign operations.

  Raises:
    ValueError: an unknown optimizer, or Adam without init_lr.
  """
  if optimizer not in ("adam", "adafactor"):
    raise ValueError(f"create_optimizer: unknown optimizer {optimizer!r}; "
                     "expected 'adam' or 'adafactor'.")
  mesh = loss.mesh
  if init_lr:
    global_step = global_step_lib.get_or_create_tf_global_step()
    learning_rate = learning_rate_schedule(
        global_step.read_value() if isinstance(global_step, tf.Variable)
        else global_step, init_lr, num_train_steps, num_warmup_steps)
    mtf_learning_rate = mtf.import_fully_replicated(
        mesh, learning_rate, mtf.Shape([]), name="learning_rate")
  else:
    if optimizer == "adam":
      raise ValueError("create_optimizer: Adam has no default learning rate; "
                       "give init_lr.")
    learning_rate = None
    mtf_learning_rate = None

  # Adam's m and v slots are not restored from an init_checkpoint:
  # fine-tuning starts them at zero, as the original did.
  if optimizer == "adam":
    opt = mtf_optimize.AdamWeightDecayOptimizer(
        learning_rate=mtf_learning_rate,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        exclude_from_weight_decay=list(EXCLUDE_FROM_WEIGHT_DECAY))
  else:
    opt = mtf_optimize.AdafactorOptimizer(
        learning_rate=mtf_learning_rate, min_dim_size_to_factor=32)

  trainable_variables = mesh.graph.trainable_variables
  if max_optimized_variable_size:
    trainable_variables = [v for v in trainable_variables
                           if v.shape.size <= max_optimized_variable_size]
  var_grads = mtf.gradients([loss],
                            [v.outputs[0] for v in trainable_variables])
  if clip_gradients:
    var_grads, _ = clip_by_global_norm(
        var_grads, clip_norm=mtf.constant(mesh, 1.0, dtype=tf.float32))
  update_ops = opt.apply_grads(var_grads, trainable_variables)
  return learning_rate, update_ops
