"""Every public name of the original Mesh TensorFlow exists here, alike.

`tests/data/original_api.json` is a copy of the original's public interface
(module -> name -> function parameters, or class methods, their parameters
and which names are properties). For the covered modules, each name must
exist in the same module, accept the original's parameters by the same names
in the same order (extra parameters only after them), and keep properties
properties and methods methods. Departures are listed, each with its reason,
in `original_api_departures.DEPARTURES` (and in CONTRIBUTING.md).
"""

import importlib
import inspect
import json
import pathlib

import pytest

import mesh_tensorflow  # pylint: disable=unused-import
from tests import original_api_departures

_API = json.loads(
    (pathlib.Path(__file__).parent / "data" / "original_api.json").read_text())

# Modules of the original checked here (the key is its name in the list).
COVERED_MODULES = (
    "mesh_tensorflow",
    "mesh_tensorflow.auto_mtf.api",
    "mesh_tensorflow.auto_mtf.graph_interface",
    "mesh_tensorflow.auto_mtf.layout_optimizer",
    "mesh_tensorflow.auto_mtf.memory_estimator",
    "mesh_tensorflow.auto_mtf.print_cp_model_solution",
    "mesh_tensorflow.auto_mtf.scheduler",
    "mesh_tensorflow.auto_mtf.valid_layouts",
    "mesh_tensorflow.beam_search",
    "mesh_tensorflow.bert.bert",
    "mesh_tensorflow.bert.optimization",
    "mesh_tensorflow.bert.run_classifier",
    "mesh_tensorflow.bert.run_pretraining",
    "mesh_tensorflow.bert.run_squad",
    "mesh_tensorflow.bert.tokenization",
    "mesh_tensorflow.layers",
    "mesh_tensorflow.optimize",
    "mesh_tensorflow.placement_mesh_impl",
    "mesh_tensorflow.simd_mesh_impl",
    "mesh_tensorflow.test_utils",
    "mesh_tensorflow.tpu_variables",
    "mesh_tensorflow.utils",
    "mesh_tensorflow.transformer.adaptive_softmax",
    "mesh_tensorflow.transformer.attention",
    "mesh_tensorflow.transformer.dataset",
    "mesh_tensorflow.transformer.evolved_transformer",
    "mesh_tensorflow.transformer.funnel_transformer",
    "mesh_tensorflow.transformer.fixup_layers",
    "mesh_tensorflow.transformer.learning_rate_schedules",
    "mesh_tensorflow.transformer.memory_layers",
    "mesh_tensorflow.transformer.moe",
    "mesh_tensorflow.transformer.transformer",
    "mesh_tensorflow.transformer.transformer_layers",
    "mesh_tensorflow.transformer.universal_transformer",
    "mesh_tensorflow.transformer.utils",
    "mesh_tensorflow.transformer.main",
    "mesh_tensorflow.transformer.vocab_embeddings",
    "mesh_tensorflow.transformer.vocabulary",
    "mesh_tensorflow.transformer.t2t_vocabulary",
)


def _module_entries():
  by_module = {key.split(" ")[0]: names
               for key, names in _API["modules"].items()}
  for module in COVERED_MODULES:
    for name, spec in sorted(by_module[module].items()):
      yield module, name, spec


def _parameter_problems(fn, wanted, label):
  """What is wrong with `fn`'s parameters against the original's list."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return [f"{label}: no signature"]
  params = [p for p in signature.parameters.values()
            if p.name not in ("self", "cls")]
  named = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                           p.POSITIONAL_OR_KEYWORD,
                                           p.KEYWORD_ONLY)]
  names = [p.name for p in named]
  want_named = [w for w in wanted if w not in ("self", "cls")
                and not w.startswith("*")]
  problems = []
  if names[:len(want_named)] != want_named:
    problems.append(f"{label} takes {names}, the original {list(wanted)}")
  else:
    for extra in named[len(want_named):]:
      if (extra.default is inspect.Parameter.empty
          and extra.kind != extra.KEYWORD_ONLY):
        problems.append(f"{label}: extra parameter {extra.name!r} needs a "
                        "default")
  kinds = {p.kind for p in params}
  for w in wanted:
    if w.startswith("**"):
      if inspect.Parameter.VAR_KEYWORD not in kinds:
        problems.append(f"{label} takes no {w}")
    elif w.startswith("*") and inspect.Parameter.VAR_POSITIONAL not in kinds:
      problems.append(f"{label} takes no {w}")
  return problems


def _static_attribute(cls, name):
  for klass in inspect.getmro(cls):
    if name in vars(klass):
      return vars(klass)[name]
  raise AttributeError(name)


def api_problems(module_name, name, spec):
  """The list of ways `module_name.name` differs from the original's."""
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError:
    return [f"module {module_name} is missing"]
  obj = getattr(module, name, None)
  if obj is None:
    return [f"{module_name}.{name} is missing"]
  if spec["kind"] == "function":
    if not callable(obj):
      return [f"{module_name}.{name} is not callable"]
    return _parameter_problems(obj, spec["params"], name)
  if not inspect.isclass(obj):
    return [f"{module_name}.{name} is not a class"]
  problems = []
  for method, wanted in spec.get("methods", {}).items():
    try:
      static = _static_attribute(obj, method)
    except AttributeError:
      problems.append(f"{name}.{method} is missing")
      continue
    if isinstance(static, property):
      problems.append(f"{name}.{method} is a property, the original's a "
                      "method")
      continue
    problems.extend(_parameter_problems(getattr(obj, method), wanted,
                                        f"{name}.{method}"))
  for prop in spec.get("properties", []):
    try:
      static = _static_attribute(obj, prop)
    except AttributeError:
      problems.append(f"{name}.{prop} (a property) is missing")
      continue
    if callable(static) and not isinstance(static, property):
      problems.append(f"{name}.{prop} is a method, the original's a property")
  return problems


_ENTRIES = list(_module_entries())


@pytest.mark.parametrize("module_name,name,spec", _ENTRIES,
                         ids=[f"{m}.{n}" for m, n, _ in _ENTRIES])
def test_name_matches_original(module_name, name, spec):
  departure = original_api_departures.DEPARTURES.get(f"{module_name}.{name}")
  pending = f"{module_name}.{name}" in original_api_departures.PENDING
  problems = api_problems(module_name, name, spec)
  if departure is not None or pending:
    if not problems:
      pytest.fail(f"{module_name}.{name} now matches the original: remove it "
                  "from the departures")
    return
  assert not problems, "\n".join(problems)


def test_departures_are_real_names():
  known = {f"{m}.{n}" for m, n, _ in _ENTRIES}
  listed = set(original_api_departures.DEPARTURES) | set(
      original_api_departures.PENDING)
  assert not listed - known


def test_departures_have_reasons_in_contributing():
  text = (pathlib.Path(__file__).parent.parent / "CONTRIBUTING.md").read_text()
  for full_name, reason in original_api_departures.DEPARTURES.items():
    assert reason.strip(), full_name
    assert f"`{full_name}`" in text, (
        f"{full_name} is a departure but CONTRIBUTING.md does not list it")
