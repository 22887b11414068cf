"""Exception types of Mesh TensorFlow.

Each subclasses ValueError so that callers catching ValueError, as with the
original library, keep working; the subclasses let tests and users tell a
shape mistake from a layout mistake.
"""


class MtfError(ValueError):
  """Base of the library's errors; built from one message string.

  An error raised while `tf.function` traces a user's (autograph-converted)
  function is re-raised by autograph with the user's source lines added,
  and keeps its own type only when autograph can rebuild it from one message
  string, which it recognises by Exception's own constructor; any other
  type comes out as autograph's StagingError, which `except ValueError` and
  `except mtf.LayoutError` would miss. So these errors use that constructor.
  """

  __init__ = Exception.__init__


class ShapeError(MtfError):
  """A tensor shape or dimension is malformed or does not fit an operation."""


class LayoutError(MtfError):
  """Layout rules cannot be applied to a tensor on a mesh."""


class IndivisibleError(LayoutError):
  """A tensor dimension does not divide evenly over its mesh dimension."""


class DTypeError(MtfError, TypeError):
  """A tensor's dtype does not fit an operation (also a TypeError)."""
