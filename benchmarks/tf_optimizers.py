"""Plain-TensorFlow SGD, AdamWeightDecay and Adafactor for the benchmarks.

The same formulas, defaults and operation order as mesh_tensorflow/optimize.py
(`SgdOptimizer`, `AdamWeightDecayOptimizer`, `AdafactorOptimizer` with its
default schedules), written on tf.Variables, so that a plain-TF baseline does
the same update work as the Mesh TensorFlow step it is compared with. Slots
are keyed by the names mtf gives them ("<var>/adam_m", "<var>_slot_vr", ...)
so the two can be compared value by value.

`make_optimizer(tf, name, variables, var_names, zeros)` creates the slots
eagerly (call it outside any tf.function); `zeros(var, keep_axes)` makes a
zero variable shaped like `var`'s `keep_axes` (DTensor passes one with the
right layout). The returned optimizer's `apply(grads, step)` runs one update
inside the caller's step function; `step` is the int64 step counter's value,
which the caller advances afterwards, as mtf's optimizers expect.
"""

# Defaults of mtf.optimize, restated for the baselines.
SGD_LR = 0.01
ADAM = dict(learning_rate=1e-4, weight_decay_rate=0.01, beta_1=0.9,
            beta_2=0.999, epsilon=1e-6)
ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR = 128
ADAFACTOR_EPSILON1 = 1e-30
ADAFACTOR_EPSILON2 = 1e-3
ADAFACTOR_DECAY_EXPONENT = 0.8
ADAFACTOR_CLIPPING_THRESHOLD = 1.0
OPTIMIZERS = ("sgd", "adafactor", "adam")


def mtf_optimizer(mtf, name, sgd_lr=SGD_LR):
  """The mtf.optimize optimizer that `make_optimizer(name)` mirrors."""
  if name == "sgd":
    return mtf.optimize.SgdOptimizer(sgd_lr)
  if name == "adam":
    return mtf.optimize.AdamWeightDecayOptimizer(**ADAM)
  if name == "adafactor":
    return mtf.optimize.AdafactorOptimizer()  # Its defaults.
  raise ValueError(f"unknown optimizer {name!r}; choose from {OPTIMIZERS}")


def factored_axes(shape):
  """Adafactor's (d0, d1) axes (largest first, stable) or None."""
  if len(shape) < 2:
    return None
  order = sorted(range(len(shape)), key=lambda i: -shape[i])
  if shape[order[1]] < ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR:
    return None
  return order[0], order[1]


class _Optimizer:

  def __init__(self, tf, variables, var_names):
    self.tf = tf
    self.variables = variables
    self.var_names = var_names
    self.slots = {}  # mtf slot name -> tf variable

  def apply(self, grads, step):
    for var, name, grad in zip(self.variables, self.var_names, grads):
      self.apply_one(var, name, grad, step)


class Sgd(_Optimizer):

  def __init__(self, tf, variables, var_names, lr=SGD_LR):
    super().__init__(tf, variables, var_names)
    self.lr = lr

  def apply_one(self, var, name, grad, step):
    del name, step
    var.assign_sub(grad * self.lr)


class AdamWeightDecay(_Optimizer):
  """m, v slots; var -= lr (m / (sqrt(v) + eps) + wd var); no bias fix."""

  def __init__(self, tf, variables, var_names, zeros):
    super().__init__(tf, variables, var_names)
    rank = lambda v: len(v.shape)
    for var, name in zip(variables, var_names):
      self.slots[name + "/adam_m"] = zeros(var, list(range(rank(var))))
      self.slots[name + "/adam_v"] = zeros(var, list(range(rank(var))))

  def apply_one(self, var, name, grad, step):
    del step
    tf = self.tf
    m, v = self.slots[name + "/adam_m"], self.slots[name + "/adam_v"]
    next_m = m * ADAM["beta_1"] + grad * (1.0 - ADAM["beta_1"])
    next_v = v * ADAM["beta_2"] + tf.square(grad) * (1.0 - ADAM["beta_2"])
    update = next_m / (tf.sqrt(next_v) + ADAM["epsilon"])
    update += var * ADAM["weight_decay_rate"]
    var.assign_sub(update * ADAM["learning_rate"])
    m.assign(next_m)
    v.assign(next_v)


class Adafactor(_Optimizer):
  """mtf's AdafactorOptimizer() defaults: factored second moment, no
  momentum, update clipped to RMS 1, scaled by max(RMS(var), 1e-3) times
  min(rsqrt(step + 1), 0.01); decay 1 - (step + 1)^-0.8."""

  def __init__(self, tf, variables, var_names, zeros):
    super().__init__(tf, variables, var_names)
    for var, name in zip(variables, var_names):
      shape = [int(d) for d in var.shape]
      axes = factored_axes(shape)
      if axes:
        d0, d1 = axes
        self.slots[name + "_slot_vr"] = zeros(
            var, [i for i in range(len(shape)) if i != d0])
        self.slots[name + "_slot_vc"] = zeros(
            var, [i for i in range(len(shape)) if i != d1])
      else:
        self.slots[name + "_slot_v"] = zeros(var, list(range(len(shape))))

  def rates(self, step):
    tf = self.tf
    step = tf.cast(step, tf.float32)
    decay = 1.0 - tf.pow(step + 1.0, -ADAFACTOR_DECAY_EXPONENT)
    lr = tf.minimum(tf.math.rsqrt(step + 1.0), 0.01)
    return decay, lr

  def apply(self, grads, step):
    decay, lr = self.rates(step)
    for var, name, grad in zip(self.variables, self.var_names, grads):
      self.apply_one(var, name, grad, (decay, lr))

  def apply_one(self, var, name, grad, step):
    tf = self.tf
    decay, lr = step
    mixing = 1.0 - decay
    rms = lambda t: tf.sqrt(tf.reduce_mean(tf.square(t)))
    update_scale = tf.maximum(rms(var), ADAFACTOR_EPSILON2) * lr
    grad_squared = tf.square(grad) + ADAFACTOR_EPSILON1
    shape = [int(d) for d in var.shape]
    axes = factored_axes(shape)
    if axes:
      d0, d1 = axes
      vr, vc = self.slots[name + "_slot_vr"], self.slots[name + "_slot_vc"]
      new_vr = vr * decay + tf.reduce_mean(grad_squared, axis=d0) * mixing
      new_vc = vc * decay + tf.reduce_mean(grad_squared, axis=d1) * mixing
      vr.assign(new_vr)
      vc.assign(new_vc)
      # new_vr lacks d0: d1's axis there moves down if it came after d0.
      d1_in_vr = d1 - (d1 > d0)
      long_term_mean = tf.reduce_mean(new_vr, axis=d1_in_vr, keepdims=True)
      r_factor = tf.math.rsqrt(new_vr / long_term_mean)
      c_factor = tf.math.rsqrt(new_vc)
      x = grad * tf.expand_dims(r_factor, d0) * tf.expand_dims(c_factor, d1)
    else:
      v = self.slots[name + "_slot_v"]
      new_v = v * decay + grad_squared * mixing
      v.assign(new_v)
      x = grad * tf.math.rsqrt(new_v)
    clipping_denom = tf.maximum(rms(x) / ADAFACTOR_CLIPPING_THRESHOLD, 1.0)
    x /= clipping_denom
    var.assign_sub(x * update_scale)


def plain_zeros(tf):
  """`zeros(var, keep_axes)` for plain TF: a zero tf.Variable on var's
  device."""

  def zeros(var, keep_axes):
    shape = [int(var.shape[i]) for i in keep_axes]
    with tf.device(var.device):
      return tf.Variable(tf.zeros(shape, tf.float32), trainable=False)
  return zeros


def make_optimizer(tf, name, variables, var_names, zeros=None, sgd_lr=SGD_LR):
  """The plain-TF optimizer `name` ("sgd", "adafactor", "adam")."""
  zeros = zeros or plain_zeros(tf)
  if name == "sgd":
    return Sgd(tf, variables, var_names, sgd_lr)
  if name == "adam":
    return AdamWeightDecay(tf, variables, var_names, zeros)
  if name == "adafactor":
    return Adafactor(tf, variables, var_names, zeros)
  raise ValueError(f"unknown optimizer {name!r}; choose from {OPTIMIZERS}")
