"""Exception types of Mesh TensorFlow.

Each subclasses ValueError so that callers catching ValueError, as with the
original library, keep working; the subclasses let tests and users tell a
shape mistake from a layout mistake.
"""

import re


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


def one_paragraph(exc, context_prefixes=()):
  """What went wrong, as one line for a binary's user: no call stacks.

  A tf.function trace's message is its last paragraph; lines starting with
  `File "` are dropped. Lines starting with one of `context_prefixes` (a
  config framework's "In file ...") are dropped from the message, and the
  first of them that names a file or bindings string is appended.
  """
  text = str(exc).strip() or type(exc).__name__
  if "in user code:" in text:
    text = re.split(r"\n\s*\n", text.strip())[-1]
  lines = [line.strip() for line in text.splitlines()]
  context = [l for l in lines if l.startswith(tuple(context_prefixes))]
  message = " ".join(l for l in lines if l and l not in context and
                     not l.startswith("File \""))
  where = ""
  for line in context:
    if line.startswith(("In file", "In bindings string")):
      where = f" ({line[3:].rstrip(':')})"
      break
  return f"{type(exc).__name__}: {message}{where}"
