"""The run's seed, mixed into every seed derived from a name.

Initial values and random ops without an explicit seed draw from seeds
derived from variable and operation names, so they are the same under
every mesh and layout. Alone, that would give every run the same start;
users expect another seed to give another initialization (as
`tf.random.set_seed` does for TF's and Keras's unseeded initializers). So a
process-wide run seed, when set, is mixed into each name-derived seed:
the CRC-32 of the name continues over the seed's decimal text. A name's
seed therefore depends on the name and the run seed only, never on the
layout, and with no run seed (the default) it is the name's CRC-32, as it
always was.

`mtf.transformer`'s `utils.run(seed=...)` sets it for the whole run.
Explicit seeds (`mtf.random_uniform(..., seed=5)`, `VarianceScaling
Initializer(seed=5)`) are used as given.
"""

import contextlib
import numbers
import zlib

_seed = None


def get_seed():
  """The run seed (an int), or None when none is set."""
  return _seed


def set_seed(seed):
  """Sets the run seed (an int, or None for none); returns the previous
  one. Process-wide: graphs built afterwards, in any thread, mix it in."""
  global _seed
  if seed is not None and (isinstance(seed, bool) or
                           not isinstance(seed, numbers.Integral)):
    raise TypeError(f"The run seed must be an int or None, got {seed!r}.")
  previous, _seed = _seed, None if seed is None else int(seed)
  return previous


@contextlib.contextmanager
def seed_scope(seed):
  """Sets the run seed to `seed` (None: none) within the block."""
  previous = set_seed(seed)
  try:
    yield
  finally:
    set_seed(previous)


def name_crc32(name):
  """The unsigned 32-bit seed of `name` under the current run seed."""
  crc = zlib.crc32(name.encode("utf-8"))
  if _seed is None:
    return crc
  return zlib.crc32(f"#seed={_seed}".encode("ascii"), crc)
