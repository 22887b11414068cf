"""Optimizers written in mtf: SGD, momentum, Adam with weight decay, Adafactor.

An optimizer turns gradients into mtf `Assign` operations. Every update is an
mtf operation and every slot (optimizer state) is an mtf variable named after
its parameter with the parameter's dimensions (or a subset of them), so the
layout rules shard optimizer state exactly like the parameter and the update
runs on each processor's slice without extra communication. Slots are
created through the variable creators (`mtf.create_slot`), and a mesh
extension may have a variable updated in another shape
(`MeshExtension.update_view`, see mesh_tensorflow.extensions): with
`mtf.shard_data_parallel`, a variable replicated over the data-parallel
mesh dimensions is updated on a 1/N shard, with slots stored as shards;
`apply_grad` then gets the gradient in that shape and a VariableView of
the variable.

The global step. As in the original, optimizers read TensorFlow's global
step (`tf.compat.v1.train.get_or_create_global_step()`, see
`mesh_tensorflow.global_step`) and never advance it: the training loop
does (the estimator, or a model function's
`tf.compat.v1.assign_add(global_step, 1)`). Learning rates and decay rates
may be given as schedules, functions from the step (a float32 mtf scalar,
TF's step imported into the mesh) to a rate.
`get_or_create_global_step(mesh)` gives the step as an int64 mtf scalar.

Layer-stacked variables (mtf.stack_layer_variables) are updated row by row
exactly as their members would be: their slots are layer-stacked (members
"<member><suffix>"), statistics over a whole variable (Adafactor's
parameter scale and update clipping) are taken per row, Adafactor never
factors over the stack dimension, and name-based choices (weight decay
exclusions, per-regex learning rates) are made on the member names, which
must agree.
"""

import math
import re

from absl import logging
import tensorflow as tf

from mesh_tensorflow import configurable as configurable_lib
from mesh_tensorflow import errors
from mesh_tensorflow import global_step as global_step_lib
from mesh_tensorflow import graph as graph_lib
from mesh_tensorflow import ops as mtf
from mesh_tensorflow import shape as shape_lib


def get_or_create_global_step(mesh):
  """TF's global step as an int64 mtf scalar on `mesh` (fully replicated).

  TF's step is created if the context has none
  (`global_step.get_or_create_tf_global_step`); it is read once per mesh.
  """
  return global_step_lib.mtf_global_step(mesh)


def _as_variable(var):
  """An mtf Variable from the Variable or its value Tensor."""
  if isinstance(var, graph_lib.Tensor):
    var = var.operation
  if not isinstance(var, mtf.Variable):
    raise TypeError(f"Expected an mtf Variable or its value, got {var!r}.")
  return var


def _member_names(var):
  """The names a variable's rows stand for: its members if layer-stacked,
  else just its own name."""
  members = getattr(var, "member_names", None)
  return [var.name] if members is None else members


def _per_member(var, fn, what):
  """fn(name), which must be the same for every member of `var`."""
  results = {name: fn(name) for name in _member_names(var)}
  distinct = set(results.values())
  if len(distinct) > 1:
    raise ValueError(
        f"Layer-stacked variable {var.name!r}: {what} differs among its "
        f"members ({results}); a stack's rows are updated alike. Make the "
        "regexes agree on all members of the stack.")
  return distinct.pop()


def _row_statistic_shape(var):
  """The output shape of a statistic over a whole variable: a scalar, or
  one per row of a layer-stacked variable (its first dimension)."""
  if getattr(var, "member_names", None) is None:
    return shape_lib.Shape([])
  return shape_lib.Shape(var.shape.dims[:1])


def _slot(var, suffix, dtype=tf.float32, shape=None):
  """The zero-initialised, non-trainable slot "<var name><suffix>".

  Its value has `shape` (default: the variable's). It is created through
  the variable creators as a slot of `var` (`mtf.create_slot`), so that a
  strategy stores it as it stores `var`'s state: with sharded weight
  updates split over the data-parallel mesh dimensions, for a layer-stacked
  variable layer-stacked along the same first dimension (members
  "<member><suffix>").
  """
  shape = var.shape if shape is None else shape
  return mtf.create_slot(var, var.name + suffix, shape, dtype,
                         tf.zeros_initializer())


def _in_update_shape(grad, var):
  """(grad, var) as the optimizer updates them: as the mesh's extensions
  see them (`MeshExtension.update_view`; e.g. with sharded weight updates
  the gradient renamed to the variable's update shape and a view whose
  assignments gather the new value)."""
  for extension in var.mesh.extensions:
    grad, var = extension.update_view(grad, var)
  return grad, var


def _step_as_float(mesh):
  return mtf.cast(get_or_create_global_step(mesh), tf.float32)


def _to_mtf_scalar(mesh, value, dtype=tf.float32):
  """A rate (Python number, tf scalar, mtf scalar or schedule) as an mtf
  scalar of `dtype`; a schedule is called with the global step."""
  if callable(value):
    value = value(_step_as_float(mesh))
  if isinstance(value, graph_lib.Tensor):
    if value.shape.ndims:
      raise errors.ShapeError(
          f"A rate must be a scalar; {value.name} has shape {value.shape}.")
    return value if value.dtype == dtype else mtf.cast(value, dtype)
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return mtf.import_fully_replicated(mesh, tf.cast(value, dtype),
                                       shape_lib.Shape([]))
  return mtf.constant(mesh, value, shape_lib.Shape([]), dtype=dtype)


def reduce_rms(x, **kwargs):
  """Root mean square of `x`'s elements: an mtf scalar by default.

  kwargs go to `mtf.reduce_mean` (`output_shape`, `reduced_dim`, `name`),
  e.g. `reduce_rms(x, reduced_dim=d)` is the RMS over `d` only.
  """
  return mtf.sqrt(mtf.reduce_mean(mtf.square(x), **kwargs))


class Optimizer:
  """Base class: `apply_grad` updates one variable with its gradient."""

  def apply_grads(self, grads, variables):
    """Returns the (combined) Assign operations of one training step.

    Args:
      grads: a list of mtf Tensors (None for a variable with no gradient,
        which is skipped with a warning).
      variables: a list of mtf Variables (or their values), e.g.
        `graph.trainable_variables`.
    """
    if len(grads) != len(variables):
      raise ValueError(f"apply_grads got {len(grads)} gradients for "
                       f"{len(variables)} variables.")
    ops = []
    for grad, var in zip(grads, variables):
      var = _as_variable(var)
      if grad is None:
        logging.warning("Variable %s has no gradient; it is not updated.",
                        var.name)
        continue
      if grad.shape != var.shape:
        raise errors.ShapeError(
            f"Gradient {grad.name} {grad.shape} does not match variable "
            f"{var.name!r} of shape {var.shape}.")
      ops.extend(self.apply_grad(*_in_update_shape(grad, var)))
    learning_rate = self._summary_learning_rate()
    if ops and learning_rate is not None:
      # For TensorBoard (the estimator writes every mtf.scalar_summary).
      mesh = _as_variable(variables[0]).mesh
      mtf.scalar_summary("learning_rate",
                         _to_mtf_scalar(mesh, learning_rate))
    if not ops:
      return ops
    # Grouped, so that the Lowering can stack variables updated together.
    return ops[0].graph.combine_assignments(ops)

  def apply_grad(self, grad, var):
    """Returns the list of Assign operations that update `var`."""
    raise NotImplementedError(f"{type(self).__name__}.apply_grad")

  def _summary_learning_rate(self):
    """The learning rate (number, tensor or schedule), or None."""
    return None


class _LearningRateOptimizer(Optimizer):
  """An optimizer whose only rate is a learning rate (maybe a schedule)."""

  def __init__(self, learning_rate):
    self._lr = learning_rate

  @property
  def lr(self):
    return self._lr

  def _summary_learning_rate(self):
    return self._lr


@configurable_lib.configurable
class SgdOptimizer(_LearningRateOptimizer):
  """Plain gradient descent: var -= learning_rate * grad."""

  def apply_grad(self, grad, var):
    # assign_sub rather than assign(var, var - ...): with bfloat16
    # activations, the value read would be rounded once more each step.
    lr = _to_mtf_scalar(var.mesh, self._lr, grad.dtype)
    return [mtf.assign_sub(var, grad * lr)]


@configurable_lib.configurable
class MomentumOptimizer(_LearningRateOptimizer):
  """SGD with momentum: v = momentum * v - lr * grad; var += v."""

  def __init__(self, learning_rate, momentum):
    super().__init__(learning_rate)
    self._momentum = momentum

  @property
  def momentum(self):
    return self._momentum

  def apply_grad(self, grad, var):
    velocity = _slot(var, "_momentum_v", dtype=var.variable_dtype)
    lr = _to_mtf_scalar(var.mesh, self._lr, velocity.dtype)
    updated_velocity = velocity * self._momentum - grad * lr
    return [mtf.assign(velocity, updated_velocity),
            mtf.assign_add(var, updated_velocity)]


@configurable_lib.configurable
class AdamWeightDecayOptimizer(Optimizer):
  """Adam with decoupled weight decay, as in BERT (no bias correction).

  m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  var -= lr (m / (sqrt(v) + eps) + weight_decay_rate var),
  the decay term only for variables matching no regex of
  `exclude_from_weight_decay`. Slots "<var>/adam_m" and "<var>/adam_v".
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None):
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def _summary_learning_rate(self):
    return self.learning_rate

  def _learning_rate_for(self, var):
    """The learning rate that updates `var`."""
    del var
    return self.learning_rate

  def apply_grad(self, grad, var):
    grad = mtf.to_float(grad)
    m = _slot(var, "/adam_m")
    v = _slot(var, "/adam_v")
    next_m = m * self.beta_1 + grad * (1.0 - self.beta_1)
    next_v = v * self.beta_2 + mtf.square(grad) * (1.0 - self.beta_2)
    update = next_m / (mtf.sqrt(next_v) + self.epsilon)
    if _per_member(var, self._do_use_weight_decay, "weight decay"):
      update += mtf.to_float(var.value) * self.weight_decay_rate
    lr = _to_mtf_scalar(var.mesh, self._learning_rate_for(var))
    update_with_lr = update * lr
    if update_with_lr.dtype != var.activation_dtype:
      update_with_lr = mtf.cast(update_with_lr, var.activation_dtype)
    return [mtf.assign_sub(var, update_with_lr),
            mtf.assign(m, next_m),
            mtf.assign(v, next_v)]

  def _do_use_weight_decay(self, param_name):
    if not self.weight_decay_rate:
      return False
    for regex in self.exclude_from_weight_decay or ():
      if re.search(regex, param_name) is not None:
        return False
    return True


def adafactor_decay_rate_adam(beta2):
  """Adam's second-moment decay with bias correction folded in: a schedule.

  decay(t) = beta2 (1 - beta2^(t-1)) / (1 - beta2^t), t = step + 1.
  """
  log_beta2 = math.log(beta2)

  def schedule(step):
    t = step + 1.0
    return (1.0 - mtf.exp((t - 1.0) * log_beta2)) * beta2 / (
        1.0 - mtf.exp(t * log_beta2))
  return schedule


@configurable_lib.configurable
def adafactor_decay_rate_pow(exponent=0.8, offset=0):
  """Second-moment decay 1 - (step - offset + 1)^-exponent: a schedule."""
  def schedule(step):
    return 1.0 - mtf.mtf_pow(step + float(1 - offset), -float(exponent))
  return schedule


def adafactor_learning_rate_default(multiply_by_parameter_scale=True):
  """min(rsqrt(step + 1), 0.01), times 0.05 without parameter scaling."""
  def schedule(step):
    rate = mtf.minimum(mtf.rsqrt(step + 1.0), 0.01)
    return rate if multiply_by_parameter_scale else rate * 0.05
  return schedule


@configurable_lib.configurable
class AdafactorOptimizer(Optimizer):
  """Adafactor (Shazeer and Stern, 2018).

  The second moment of a parameter with two dimensions of at least
  `min_dim_size_to_factor` is kept factored over its two largest dimensions
  d0 >= d1 (slots "<var>_slot_vr" without d0 and "<var>_slot_vc" without
  d1), else in full ("<var>_slot_v"); momentum ("<var>_slot_m") only when
  beta1 > 0. The update g / sqrt(v_hat) is clipped to RMS
  `clipping_threshold` and, with `multiply_by_parameter_scale`, scaled by
  max(RMS(var), epsilon2). `learning_rate` and `decay_rate` are numbers,
  scalars or schedules of the global step (module docstring); the defaults
  are `adafactor_learning_rate_default` and `adafactor_decay_rate_pow()`.
  """

  def __init__(self, multiply_by_parameter_scale=True, learning_rate=None,
               decay_rate=None, beta1=0.0, clipping_threshold=1.0,
               factored=True, epsilon1=1e-30, epsilon2=1e-3,
               min_dim_size_to_factor=128, stacked_dim_names=None,
               exclude_from_parameter_scale=None):
    self._multiply_by_parameter_scale = multiply_by_parameter_scale
    if learning_rate is None:
      learning_rate = adafactor_learning_rate_default(
          multiply_by_parameter_scale)
    self._learning_rate = learning_rate
    if decay_rate is None:
      decay_rate = adafactor_decay_rate_pow()
    self._decay_rate = decay_rate
    self._beta1 = beta1
    self._clipping_threshold = clipping_threshold
    self._factored = factored
    self._epsilon1 = epsilon1
    self._epsilon2 = epsilon2
    self._min_dim_size_to_factor = min_dim_size_to_factor
    self._stacked_dim_names = set(stacked_dim_names or ())
    self._exclude_from_parameter_scale = exclude_from_parameter_scale or []

  def _summary_learning_rate(self):
    return self._learning_rate

  def _learning_rate_for(self, var):
    """The learning rate that updates `var`."""
    del var
    return self._learning_rate

  def _factored_dims(self, shape):
    """The two largest dimensions (largest first) if they factor, else None.

    Stacked dimensions (several variables stacked into one) never factor
    (a layer-stacked variable passes the shape of one row).
    """
    if not self._factored:
      return None
    dims = [d for d in shape.dims
            if shape_lib.split_shard_dimension_name(d.name)[0]
            not in self._stacked_dim_names]
    if len(dims) < 2:
      return None
    # A stable sort: ties keep the shape's order, as in the original.
    dims = sorted(dims, key=lambda d: -d.size)
    if dims[1].size < self._min_dim_size_to_factor:
      return None
    return dims[:2]

  def _scales_by_parameter(self, var):
    if not self._multiply_by_parameter_scale:
      return False
    return _per_member(
        var, lambda name: not any(
            re.search(regex, name) is not None
            for regex in self._exclude_from_parameter_scale),
        "exclude_from_parameter_scale")

  def apply_grad(self, grad, var):
    mesh = var.mesh
    grad = mtf.to_float(grad)
    row_stat = _row_statistic_shape(var)
    # Factored over one row's dimensions (never the stack dimension).
    factored_dims = self._factored_dims(var.shape - row_stat.dims)
    if factored_dims:
      d0, d1 = factored_dims
      vr_shape = var.shape - d0
      vc_shape = var.shape - d1
      vr = _slot(var, "_slot_vr", shape=vr_shape)
      vc = _slot(var, "_slot_vc", shape=vc_shape)
    else:
      v = _slot(var, "_slot_v")
    if self._beta1:
      m = _slot(var, "_slot_m")

    decay_rate = _to_mtf_scalar(mesh, self._decay_rate)
    mixing_rate = 1.0 - decay_rate
    learning_rate = _to_mtf_scalar(mesh, self._learning_rate_for(var))
    old_val = mtf.to_float(var.value)
    if self._scales_by_parameter(var):
      update_scale = mtf.maximum(
          reduce_rms(old_val, output_shape=row_stat),
          self._epsilon2) * learning_rate
    else:
      update_scale = learning_rate
    grad_squared = mtf.square(grad) + self._epsilon1
    updates = []
    if factored_dims:
      new_vr = vr * decay_rate + mtf.reduce_mean(
          grad_squared, output_shape=vr_shape) * mixing_rate
      new_vc = vc * decay_rate + mtf.reduce_mean(
          grad_squared, output_shape=vc_shape) * mixing_rate
      updates += [mtf.assign(vr, new_vr), mtf.assign(vc, new_vc)]
      long_term_mean = mtf.reduce_mean(new_vr, reduced_dim=d1)
      r_factor = mtf.rsqrt(new_vr / long_term_mean)
      c_factor = mtf.rsqrt(new_vc)
      x = grad * r_factor * c_factor
    else:
      new_v = v * decay_rate + grad_squared * mixing_rate
      updates.append(mtf.assign(v, new_v))
      x = grad * mtf.rsqrt(new_v)
    if self._clipping_threshold is not None:
      clipping_denom = mtf.maximum(
          reduce_rms(x, output_shape=row_stat) / self._clipping_threshold,
          1.0)
      x /= clipping_denom
    subtrahend = x * update_scale
    if self._beta1:
      new_m = m * self._beta1 + subtrahend * (1.0 - self._beta1)
      subtrahend = new_m
      updates.append(mtf.assign(m, new_m))
    if subtrahend.dtype != var.activation_dtype:
      subtrahend = mtf.cast(subtrahend, var.activation_dtype)
    # assign_sub keeps the float32 slices exact under bfloat16 activations.
    updates.append(mtf.assign_sub(var, subtrahend))
    return updates


class OptimizerHParams:
  """The hyperparameters `make_optimizer` reads (a minimal HParams)."""

  def __init__(self, optimizer="Adafactor",
               optimizer_adafactor_decay_type="pow",
               optimizer_adafactor_beta1=0.0,
               optimizer_adafactor_beta2=0.999,
               optimizer_adafactor_memory_exponent=0.8,
               optimizer_adafactor_clipping_threshold=1.0,
               optimizer_adafactor_multiply_by_parameter_scale=True,
               optimizer_adafactor_factored=True):
    self.optimizer = optimizer
    self.optimizer_adafactor_decay_type = optimizer_adafactor_decay_type
    self.optimizer_adafactor_beta1 = optimizer_adafactor_beta1
    self.optimizer_adafactor_beta2 = optimizer_adafactor_beta2
    self.optimizer_adafactor_memory_exponent = (
        optimizer_adafactor_memory_exponent)
    self.optimizer_adafactor_clipping_threshold = (
        optimizer_adafactor_clipping_threshold)
    self.optimizer_adafactor_multiply_by_parameter_scale = (
        optimizer_adafactor_multiply_by_parameter_scale)
    self.optimizer_adafactor_factored = optimizer_adafactor_factored


def adafactor_optimizer_from_hparams(hparams, lr):
  """An AdafactorOptimizer configured by `hparams` (see OptimizerHParams)."""
  decay_type = hparams.optimizer_adafactor_decay_type
  if decay_type == "Adam":
    decay_rate = adafactor_decay_rate_adam(hparams.optimizer_adafactor_beta2)
  elif decay_type == "pow":
    decay_rate = adafactor_decay_rate_pow(
        hparams.optimizer_adafactor_memory_exponent)
  else:
    raise ValueError(f"Unknown optimizer_adafactor_decay_type {decay_type!r}; "
                     "use 'Adam' or 'pow'.")
  return AdafactorOptimizer(
      multiply_by_parameter_scale=(
          hparams.optimizer_adafactor_multiply_by_parameter_scale),
      learning_rate=lr,
      decay_rate=decay_rate,
      beta1=hparams.optimizer_adafactor_beta1,
      clipping_threshold=hparams.optimizer_adafactor_clipping_threshold,
      factored=hparams.optimizer_adafactor_factored)


def make_optimizer(hparams, lr):
  """SgdOptimizer(lr) or an Adafactor from `hparams.optimizer`."""
  if hparams.optimizer == "SGD":
    return SgdOptimizer(lr)
  if hparams.optimizer == "Adafactor":
    return adafactor_optimizer_from_hparams(hparams, lr)
  raise ValueError(f"Unknown optimizer {hparams.optimizer!r}; use 'SGD' or "
                   "'Adafactor'.")


# ------------------------------------------ several learning-rate schedules


@configurable_lib.configurable
def product_learning_rate(step, total_train_steps, factors, offset=0):
  """The product of `factors` at `step`: a learning rate.

  Each factor is a number or a function `f(step, total_train_steps)` (e.g.
  the Transformer's learning-rate schedules); with an `offset`, functions
  see `step - offset` and `total_train_steps - offset` (fine-tuning from a
  checkpoint's step). The same as the Transformer's
  `learning_rate_schedules.product_learning_rate`, kept here so that the
  optimizers do not import the Transformer.

  Args:
    step: the step (a tf scalar, an mtf scalar or a number).
    total_train_steps: a number.
    factors: a list of numbers and/or functions.
    offset: a number.

  Returns:
    the learning rate (of the type the factors give; 1.0 for no factors).
  """
  if factors is None:
    raise ValueError("product_learning_rate needs factors: a list of "
                     "numbers and/or functions of (step, total_train_steps).")
  rate = 1.0
  for factor in factors:
    if callable(factor):
      factor = factor(step - offset, total_train_steps - offset)
    rate *= factor
  return rate


@configurable_lib.configurable
def compute_lr_for_step(schedules, learning_rate, train_steps=None):
  """The learning rate of each schedule at TF's global step.

  Args:
    schedules: a list; each entry is None (use `learning_rate`) or a list of
      factors for `product_learning_rate`, evaluated at TF's global step.
    learning_rate: the rate for None entries (returned as it is: a number,
      a tensor or a schedule of the step).
    train_steps: the total number of training steps (the schedules'
      `total_train_steps`); needed when a factor is a function.

  Returns:
    a list of rates, one per schedule (float32 tf scalars for factor lists).
  """
  rates = []
  for schedule in schedules:
    if schedule is None:
      rates.append(learning_rate)
      continue
    if train_steps is None and any(callable(f) for f in schedule):
      raise ValueError(
          f"compute_lr_for_step: the schedule {schedule!r} needs "
          "train_steps, the total number of training steps.")
    step = global_step_lib.get_or_create_tf_global_step()
    step = step.read_value() if isinstance(step, tf.Variable) else step
    rate = product_learning_rate(step=step, total_train_steps=train_steps,
                                 factors=schedule)
    rates.append(tf.cast(rate, tf.float32))
  return rates


class _MultiLRSchedule:
  """Mixin: variables matching a regex get that regex's learning rate.

  The rate of a variable is that of the first regex of `variable_search`
  that `re.search` finds in its name; other variables keep the optimizer's
  own learning rate. (The original updated a matching variable once per
  regex; here each variable is updated once.) Each alternative rate is
  recorded as the scalar summary "alt_learning_rate" ("_1", "_2", ... for
  the following ones).
  """

  def _init_schedules(self, variable_search, alt_lr_schedules, train_steps):
    variable_search = list(variable_search)
    alt_lr_schedules = list(alt_lr_schedules)
    if len(variable_search) != len(alt_lr_schedules):
      raise ValueError(
          f"{type(self).__name__}: {len(variable_search)} variable_search "
          f"regexes but {len(alt_lr_schedules)} alt_lr_schedules; give one "
          "schedule per regex.")
    self._variable_search = variable_search
    self._alt_lr_schedules = alt_lr_schedules
    self._train_steps = train_steps
    self._alt_rates = None

  def _compute_alt_rates(self):
    kwargs = {}
    if self._train_steps is not None:
      kwargs["train_steps"] = self._train_steps
    return compute_lr_for_step(self._alt_lr_schedules,
                               self._summary_learning_rate(), **kwargs)

  def apply_grads(self, grads, variables):
    self._alt_rates = self._compute_alt_rates()
    try:
      ops = super().apply_grads(grads, variables)
      live = [_as_variable(v) for v, g in zip(variables, grads)
              if g is not None]
      if live:
        alternatives = [r for r, s in zip(self._alt_rates,
                                          self._alt_lr_schedules)
                        if s is not None]
        for i, rate in enumerate(alternatives):
          name = "alt_learning_rate" + (f"_{i}" if i else "")
          mtf.scalar_summary(name, _to_mtf_scalar(live[0].mesh, rate))
      return ops
    finally:
      self._alt_rates = None

  def _learning_rate_for(self, var):
    rates = self._alt_rates
    if rates is None:
      rates = self._compute_alt_rates()

    def first_match(name):
      for i, regex in enumerate(self._variable_search):
        if re.search(regex, name) is not None:
          return i
      return None

    index = _per_member(var, first_match, "the matching variable_search "
                        "regex")
    if index is not None:
      return rates[index]
    return self._summary_learning_rate()


@configurable_lib.configurable
class AdafactorWithMultiLRSchedule(_MultiLRSchedule, AdafactorOptimizer):
  """Adafactor whose variables may follow other learning-rate schedules.

  Args:
    variable_search: a list of regexes of variable names.
    alt_lr_schedules: one entry per regex: a list of factors for
      `product_learning_rate` (evaluated at TF's global step), or None for
      the optimizer's own learning rate.
    train_steps: the schedules' total number of training steps (keyword
      only; the original took it from gin's `compute_lr_for_step`).
    **kwargs: AdafactorOptimizer's arguments.
  """

  def __init__(self, variable_search, alt_lr_schedules, *, train_steps=None,
               **kwargs):
    AdafactorOptimizer.__init__(self, **kwargs)
    self._init_schedules(variable_search, alt_lr_schedules, train_steps)


@configurable_lib.configurable
class AdamWithMultiLRSchedule(_MultiLRSchedule, AdamWeightDecayOptimizer):
  """AdamWeightDecay whose variables may follow other learning-rate
  schedules (see AdafactorWithMultiLRSchedule; **kwargs are
  AdamWeightDecayOptimizer's arguments)."""

  def __init__(self, variable_search, alt_lr_schedules, *, train_steps=None,
               **kwargs):
    AdamWeightDecayOptimizer.__init__(self, **kwargs)
    self._init_schedules(variable_search, alt_lr_schedules, train_steps)
