"""A user's configuration mistake as one paragraph, for the binaries.

A mistake in a gin file, a --gin_param or a flag ends a binary with one
paragraph on stderr that names the binding or flag to fix, and exit status
1 (`run_main`); --show_traceback prints the Python traceback as well.
`describe` tells such mistakes from bugs:

- a configurable called without a parameter it requires: the paragraph
  says which bindings to add (`dataset.untokenized_tfds_dataset.
  dataset_name = ...`);
- an unknown configurable or parameter: gin's message, with its file and
  line;
- a value of the wrong type: the binding whose string stands where its
  configurable's default is a number, a boolean or a function;
- a file, glob or vocabulary that is not there: the flag or binding whose
  value the message quotes;
- a mistake the code reports itself (`ConfigurationError`, or one of the
  input errors, `INPUT_ERRORS`, that the binaries have always reported so).

Any other exception is a bug and keeps its traceback. Gin belongs to the
Transformer package and its binaries: the BERT binaries use this module
through mesh_tensorflow.bert.run_common, and the language core never
imports it.
"""

import ast
import importlib
import inspect
import re
import sys
import traceback

from absl import app
from absl import flags
import gin
import tensorflow as tf

from mesh_tensorflow import errors as mtf_errors

FLAGS = flags.FLAGS


class ConfigurationError(ValueError):
  """A mistake in a user's configuration; the message says what to fix."""


# Exceptions that mean bad input (flags, gin, files) rather than a bug.
INPUT_ERRORS = (ValueError, TypeError, KeyError, OSError, LookupError,
                tf.errors.OpError)

# Lines gin appends to a message: where a binding was parsed or called.
_GIN_CONTEXT = ("In call to configurable", "In file", "In bindings string")
_REQUIRED = re.compile(
    r"Required bindings for `([^`]+)` not provided in config: (\[[^\]]*\])")
_UNSUPPLIED = re.compile(
    r"No values supplied by Gin or caller for arguments: (\[[^\]]*\])")
_CALLED = re.compile(r"In call to configurable '([^']+)'")
_MACRO = "gin.macro"
# A flag or gin value shorter than this is not looked for in a message.
_MIN_QUOTED = 3
_MAX_CULPRITS = 3


def run_main(main, argv, input_errors=()):
  """main(argv); a configuration mistake ends it with exit status 1.

  The mistake is written to stderr as "error: <one paragraph>" (after the
  traceback with --show_traceback). Other exceptions (bugs) and absl's
  UsageError propagate.

  Args:
    main: the binary's main(argv).
    argv: absl's leftover argv.
    input_errors: more exception types that mean bad input.

  Returns:
    what main returns.
  """
  try:
    return main(argv)
  except app.UsageError:
    raise
  except Exception as exc:  # pylint: disable=broad-except
    message = describe(exc, input_errors)
    if message is None:
      raise
    if "show_traceback" in FLAGS and FLAGS.show_traceback:
      traceback.print_exc()
    sys.stderr.write(f"\nerror: {message}\n")
    sys.exit(1)


def describe(exc, input_errors=()):
  """exc as one paragraph naming the binding or flag at fault; None if it
  looks like a bug (an exception of no input-error type)."""
  missing = _missing_bindings(exc)
  if missing:
    return f"{ConfigurationError.__name__}: {missing}"
  if not isinstance(exc, INPUT_ERRORS + tuple(input_errors)):
    return None
  text = mtf_errors.one_paragraph(exc, context_prefixes=_GIN_CONTEXT)
  culprits = _culprits(str(exc), text)
  if culprits:
    text = f"{text} ({'; '.join(culprits[:_MAX_CULPRITS])})"
  return text


def import_modules(names, flag):
  """Imports each of `names`, the values of --<flag>; a module that does
  not exist is a ConfigurationError naming the flag (an exception inside
  an existing module propagates)."""
  for name in names or ():
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if not e.name or not (name + ".").startswith(e.name + "."):
        raise
      raise ConfigurationError(
          f"--{flag}={name}: no module {e.name!r} to import; is its folder "
          "on PYTHONPATH?") from None


# ------------------------------------------------------- missing bindings


def _missing_bindings(exc):
  """What to add, when gin called a configurable without parameters it
  requires (gin's RuntimeError, or a TypeError for positional ones)."""
  text = str(exc)
  match = _REQUIRED.search(text)
  if match and isinstance(exc, RuntimeError):
    name, params = match.group(1), match.group(2)
  else:
    match = _UNSUPPLIED.search(text)
    called = match and _CALLED.search(text, match.end())
    if not (called and isinstance(exc, TypeError)):
      return None
    name, params = called.group(1), match.group(1)
  try:
    params = [str(p) for p in ast.literal_eval(params)]
  except (ValueError, SyntaxError):
    return None
  selector = _full_selector(name)
  short = _short_selector(selector) if selector else name
  bound_by, scopes = [], set()
  for binding, value, _, _ in _bindings():
    found = _reference_scopes(value, selector)
    if found:
      bound_by.append(f"`{binding}`")
      scopes.update(found)
  # Referred to under one scope only: the parameters go there too.
  prefix = ""
  if len(scopes) == 1 and "" not in scopes:
    prefix = f"{scopes.pop()}/"
  where = f" (which {_and(bound_by)} names)" if bound_by else ""
  adds = ", ".join(f"`{prefix}{short}.{p} = ...`" for p in params)
  what = "a value" if len(params) == 1 else "values"
  return (f"`{short}`{where} needs {what} for {_and(params)}, which "
          f"neither the gin config nor its caller gives: add {adds} to a "
          "gin file or a --gin_param.")


def _and(words):
  words = list(words)
  if len(words) < 2:
    return "".join(words)
  return f"{', '.join(words[:-1])} and {words[-1]}"


def _reference_scopes(value, selector):
  """The scopes of the references to configurable `selector` in value."""
  scopes = []
  for v in _flat(value):
    configurable = getattr(v, "configurable", None)
    if configurable is not None and configurable.selector == selector:
      scopes.append("/".join(v.scopes))
  return scopes


def _flat(value):
  """value and everything nested in its lists, tuples and dicts."""
  yield value
  if isinstance(value, (list, tuple)):
    for v in value:
      yield from _flat(v)
  elif isinstance(value, dict):
    for v in value.values():
      yield from _flat(v)


# -------------------------------------------------------- gin's bindings


def _registry():
  return gin.config._REGISTRY  # pylint: disable=protected-access


def _full_selector(name):
  """The full selector of the configurable gin calls `name`, or None."""
  matches = _registry().matching_selectors(name)
  return matches[0] if len(matches) == 1 else None


def _short_selector(selector):
  """selector as the original's gin files write it: the fewest trailing
  components (two at least, as in `utils.run`) that name it alone."""
  parts = selector.split(".")
  for k in range(min(2, len(parts)), len(parts) + 1):
    candidate = ".".join(parts[-k:])
    if len(_registry().matching_selectors(candidate)) == 1:
      return candidate
  return selector


def _bindings():
  """(name, value, selector, param) of each gin binding: name is
  `scope/module.fn.param`, or a macro's name (selector and param None)."""
  config = gin.config._CONFIG  # pylint: disable=protected-access
  for (scope, selector), params in list(config.items()):
    for param, value in params.items():
      if selector == _MACRO:
        yield scope, value, None, None
      else:
        scope_prefix = f"{scope}/" if scope else ""
        yield (f"{scope_prefix}{_short_selector(selector)}.{param}", value,
               selector, param)


def _default(selector, param):
  """The default of `param` in the signature of configurable `selector`."""
  configurable = _registry().get(selector)
  if configurable is None:
    return inspect.Parameter.empty
  try:
    parameter = inspect.signature(configurable.wrapped).parameters.get(param)
  except (TypeError, ValueError):
    return inspect.Parameter.empty
  return inspect.Parameter.empty if parameter is None else parameter.default


def _expected_kind(default):
  """What a default says a parameter takes, where a string cannot be it."""
  if isinstance(default, bool):
    return "a boolean"
  if isinstance(default, int):
    return "an integer"
  if isinstance(default, float):
    return "a number"
  if isinstance(default, (tuple, list)):
    return f"a {type(default).__name__}"
  if inspect.isfunction(default):
    return "a function"
  return None


def _default_text(default):
  return getattr(default, "__name__", None) or repr(default)


# ------------------------------------------------------------- culprits


def _culprits(message, text):
  """Bindings and flags that made the mistake `message` (text: the
  paragraph so far), as short phrases."""
  culprits = list(_mistyped(message))
  for name, value, _, _ in _bindings():
    if (isinstance(value, str) and _quotes(text, value) and
        name not in text and not any(name in c for c in culprits)):
      culprits.append(f"set by `{name} = {value!r}`")
  for name, value in _flag_values():
    if _quotes(text, value) and f"--{name}" not in text:
      culprits.append(f"given by --{name}")
  return culprits


def _quotes(text, value):
  """Whether text holds value whole: not as part of a longer word or path
  (a flag's folder is not quoted by a message about a file in it)."""
  if len(value) < _MIN_QUOTED:
    return False
  pattern = rf"(?<![\w./-]){re.escape(value)}(?![\w/-]|\.\w)"
  return re.search(pattern, text) is not None


def _mistyped(message):
  """Bindings of the configurables the exception passed through whose
  string stands where their default is not a string."""
  called = set(_CALLED.findall(message))
  for name, value, selector, param in _bindings():
    if (selector is None or not isinstance(value, str) or
        selector.split(".")[-1] not in called):
      continue
    default = _default(selector, param)
    kind = _expected_kind(default)
    if kind and name not in message:
      yield (f"`{name} = {value!r}` is a string where {kind} is expected, "
             f"like its default {_default_text(default)}")


def _flag_values():
  """(name, value) of the string flags given on the command line."""
  if not FLAGS.is_parsed():
    return
  seen = set()
  for module_flags in FLAGS.flags_by_module_dict().values():
    for flag in module_flags:
      if (flag.name not in seen and flag.present and
          isinstance(flag.value, str)):
        seen.add(flag.name)
        yield flag.name, flag.value
