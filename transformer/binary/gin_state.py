"""A gin configuration of its own, installed for a while and put back.

The run planner builds a Transformer in many structures (pipelined or
not, recomputing some layers), each under a few more gin bindings, and
may plan from gin files that are not the caller's. A `GinState` holds one
whole configuration (bindings, macros, imports, singletons, the operative
config); `installed(lines)` makes it gin's for the duration of a `with`
block, plus the given binding lines, and then puts the caller's
configuration back exactly, also when the caller's is locked
(`gin.finalize`, as the binary locks it): nothing the block binds, or
records as operative, is left behind.

gin keeps its configuration in module globals and has no public call to
save and restore it; this module is the one place that touches them.
"""

import contextlib
import copy

import gin
import gin.config as gin_config

# pylint: disable=protected-access


def _snapshot():
  """A copy of gin's global configuration."""
  with gin_config._OPERATIVE_CONFIG_LOCK:
    operative = {k: dict(v) for k, v in gin_config._OPERATIVE_CONFIG.items()}
  return dict(
      config={k: dict(v) for k, v in gin_config._CONFIG.items()},
      operative=operative,
      imports=set(gin_config._IMPORTS),
      singletons=dict(gin_config._SINGLETONS),
      search_paths=list(gin_config._LOCATION_PREFIXES),
      locked=gin_config.config_is_locked())


def _restore(snapshot):
  """Makes gin's global configuration that of `snapshot` (in place: gin's
  functions read the same objects)."""
  gin_config._CONFIG.clear()
  gin_config._CONFIG.update(
      {k: dict(v) for k, v in snapshot["config"].items()})
  with gin_config._OPERATIVE_CONFIG_LOCK:
    gin_config._OPERATIVE_CONFIG.clear()
    gin_config._OPERATIVE_CONFIG.update(
        {k: dict(v) for k, v in snapshot["operative"].items()})
  gin_config._IMPORTS.clear()
  gin_config._IMPORTS.update(snapshot["imports"])
  gin_config._SINGLETONS.clear()
  gin_config._SINGLETONS.update(snapshot["singletons"])
  gin_config._LOCATION_PREFIXES[:] = snapshot["search_paths"]
  gin_config._set_config_is_locked(snapshot["locked"])


# pylint: enable=protected-access


class GinState:
  """One gin configuration, kept aside from gin's global one."""

  def __init__(self, snapshot):
    self._snapshot = snapshot

  @classmethod
  def capture(cls):
    """The configuration gin has now (the caller's keeps running)."""
    return cls(_snapshot())

  @classmethod
  def parse(cls, files, bindings, search_paths=(), skip_unknown=False):
    """The configuration of gin `files` then `bindings` (lines), parsed on
    an empty one; gin's global configuration is left as it was.

    Args:
      files: paths of gin files, parsed in order.
      bindings: gin lines ("name = value"), parsed after the files.
      search_paths: folders `include` lines (and files) are looked up in.
      skip_unknown: as gin.parse_config_files_and_bindings.
    """
    caller = _snapshot()
    try:
      gin.clear_config()
      for path in search_paths:
        gin.add_config_file_search_path(path)
      gin.parse_config_files_and_bindings(
          list(files), list(bindings), skip_unknown=skip_unknown,
          finalize_config=False)
      return cls(_snapshot())
    finally:
      _restore(caller)

  @contextlib.contextmanager
  def installed(self, bindings=()):
    """Makes this configuration gin's, plus binding lines `bindings`
    ("name = value", parsed as a gin file's), inside the block; then puts
    back the caller's. The block's own bindings and operative records
    stay in neither."""
    caller = _snapshot()
    try:
      _restore(self._snapshot)
      with gin.unlock_config():
        if bindings:
          gin.parse_config(list(bindings))
      yield
    finally:
      _restore(caller)

  def query(self, binding_key, default=None):
    """The value bound to `binding_key` in this configuration (references
    evaluated as gin passes them), or `default` when nothing is bound."""
    with self.installed():
      try:
        value = gin.query_parameter(binding_key)
      except ValueError:
        return default
      return copy.deepcopy(value)
