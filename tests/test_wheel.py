"""The wheel built from the committed tree works where only the wheel is.

`make test` installs the package in editable mode, whose finder falls back to
the source tree: a package that setup.py forgets still imports there. This
test builds the wheel (and the sdist) from a clean copy of HEAD, installs the
wheel into a scratch folder and, in interpreters that see only that folder
and the virtual environment's third-party packages (`python -S`: no `.pth`
file, so no editable finder; the working directory outside the repository),
imports every library module that BUILD lists, finds every gin file through
the package's own gin folder, loads the shipped machine files, runs the
binary's --helpfull and runs the README's first example on a 2-processor
mesh.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARY_FOLDERS = ("mesh_tensorflow", "transformer")


def _module_name(relative_path):
  """Installed module name of a repository path such as transformer/x.py."""
  parts = list(pathlib.PurePosixPath(relative_path).with_suffix("").parts)
  if parts[0] == "transformer":
    parts = ["mesh_tensorflow"] + parts
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _build_library_modules():
  """Modules that BUILD lists as library code (py_library srcs)."""
  text = (ROOT / "BUILD").read_text()
  paths = re.findall(r'"((?:%s)/[^"]+\.py)"' % "|".join(LIBRARY_FOLDERS),
                     text)
  return sorted({_module_name(p) for p in paths})


def _run(args, cwd, env=None, timeout=300, returncodes=(0,)):
  result = subprocess.run(args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
  assert result.returncode in returncodes, (
      f"{' '.join(map(str, args))[:300]} failed:\n{result.stdout[-3000:]}\n"
      f"{result.stderr[-3000:]}")
  return result


def _committed_tree(destination):
  """Extracts HEAD of the checkout into `destination` (skips if no git)."""
  try:
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
  except FileNotFoundError:
    pytest.skip("git is not installed: cannot take a clean copy of the "
                "committed tree to build the wheel from.")
  if top.returncode != 0 or pathlib.Path(top.stdout.strip()) != ROOT:
    pytest.skip(f"{ROOT} is not a git checkout: the wheel is built from the "
                "committed tree (git archive HEAD).")
  archive = destination.parent / "head.tar"
  with open(archive, "wb") as f:
    subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT,
                   stdout=f, check=True)
  with tarfile.open(archive) as tar:
    tar.extractall(destination, filter="data")
  return destination


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """(wheel path, sdist path, scratch install folder, source copy)."""
  base = tmp_path_factory.mktemp("wheel")
  source = _committed_tree(base / "source")
  dist = base / "dist"
  # Offline, with the setuptools and wheel of this environment.
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
        "--no-build-isolation", "--no-index", "--quiet", "-w", str(dist),
        str(source)], cwd=base)
  _run([sys.executable, "setup.py", "--quiet", "sdist", "-d", str(dist)],
       cwd=source)
  (wheel,) = dist.glob("*.whl")
  (sdist,) = dist.glob("*.tar.gz")
  scratch = base / "site"
  _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
        "--quiet", "--target", str(scratch), str(wheel)], cwd=base)
  return wheel, sdist, scratch, source


def _isolated(scratch, args, cwd, timeout=300, returncodes=(0,)):
  """Runs `python -S args` seeing the scratch install and third-party
  packages only (no .pth files, so not the editable install)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
  env["PYTHONPATH"] = os.pathsep.join(
      [str(scratch), sysconfig.get_paths()["purelib"]])
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  return _run([sys.executable, "-S"] + list(args), cwd=cwd, env=env,
              timeout=timeout, returncodes=returncodes)


_IMPORT_CHECK = r"""
import importlib, json, pathlib, sys
scratch, modules, gin_files = sys.argv[1], json.loads(sys.argv[2]), json.loads(
    sys.argv[3])
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils
for name in modules:
  module = importlib.import_module(name)
  where = pathlib.Path(module.__file__).resolve()
  assert where.is_relative_to(scratch), f"{name} imported from {where}"
folder = utils.gin_dir()
assert pathlib.Path(folder).resolve().is_relative_to(scratch), folder
for name in gin_files:
  path = pathlib.Path(utils.find_gin_file(name, [folder]))
  assert path.resolve().is_relative_to(scratch), (name, path)
from mesh_tensorflow.bert import bert
configs = pathlib.Path(bert.__file__).parent / "config"
assert configs.resolve().is_relative_to(scratch), configs
names = sorted(p.name for p in configs.glob("*.json"))
assert len(names) == 14 and "base.json" in names, names
for name in names:
  bert.BertConfig.from_json_file(str(configs / name))
from mesh_tensorflow.auto_mtf import machine
machines = machine.shipped_machine_names()
assert machines == ["gpu_8x_node", "tpu_v3_pod"], machines
assert pathlib.Path(machine.SHIPPED_MACHINES_DIR).resolve().is_relative_to(
    scratch), machine.SHIPPED_MACHINES_DIR
for name in machines:
  machine.shipped_machine(name)
print("version", mtf.__version__, "modules", len(modules), "gin",
      len(gin_files), "bert configs", len(names), "machines", len(machines))
"""


def test_wheel_installs_and_imports_every_library_module(built, tmp_path):
  _, _, scratch, source = built
  modules = _build_library_modules()
  assert "mesh_tensorflow.cluster" in modules
  gin_root = source / "transformer" / "gin"
  gin_files = sorted(str(p.relative_to(gin_root))
                     for p in gin_root.rglob("*.gin"))
  assert gin_files
  result = _isolated(scratch, [
      "-c", _IMPORT_CHECK, str(scratch.resolve()), json.dumps(modules),
      json.dumps(gin_files)], cwd=tmp_path)
  version = re.search(r'__version__ = "([^"]+)"',
                      (source / "mesh_tensorflow/version.py").read_text())[1]
  assert result.stdout.split()[:2] == ["version", version], result.stdout


def test_wheel_runs_the_binary(built, tmp_path):
  scratch = built[2]
  # absl exits with status 1 after printing the help.
  result = _isolated(scratch, ["-m", "mesh_tensorflow.transformer.main",
                               "--helpfull"], cwd=tmp_path, returncodes=(0, 1))
  assert "--gin_file" in result.stdout and "--model_dir" in result.stdout


def test_wheel_runs_the_readme_example_on_two_processors(built, tmp_path):
  scratch, source = built[2], built[3]
  text = (source / "README.md").read_text()
  example = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)[0]
  # The README's 8 logical devices and meshes, shrunk to 2 processors.
  for old, new in (("* 8)", "* 2)"), ('"all:8"', '"all:2"'),
                   ('"rows:2;cols:4"', '"rows:1;cols:2"')):
    assert old in example, f"the README's first example lost {old!r}"
    example = example.replace(old, new)
  script = tmp_path / "readme_example.py"
  script.write_text(example)
  result = _isolated(scratch, [str(script)], cwd=tmp_path)
  lines = [l for l in result.stdout.splitlines() if "loss" in l]
  assert len(lines) == 4, result.stdout
  # Every layout ends at the same loss, below the first.
  finals = {l.split()[-1] for l in lines}
  assert len(finals) == 1, lines
  assert float(finals.pop()) < float(lines[0].split()[-3]), lines


def _wheel_contents(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
  modules = {_module_name(n.replace("mesh_tensorflow/transformer/",
                                    "transformer/", 1))
             for n in names if n.endswith(".py")}
  gin = {n.split("/gin/", 1)[1] for n in names if n.endswith(".gin")}
  return modules, gin


def _sdist_contents(sdist):
  with tarfile.open(sdist) as tar:
    names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
  modules = {_module_name(n) for n in names
             if n.endswith(".py") and n.split("/")[0] in LIBRARY_FOLDERS}
  gin = {n.split("/gin/", 1)[1] for n in names
         if n.endswith(".gin") and n.startswith("transformer/gin/")}
  return modules, gin


def test_wheel_and_sdist_hold_every_module_and_gin_file(built):
  wheel, sdist, _, source = built
  source_modules = {
      _module_name(str(p.relative_to(source)))
      for folder in LIBRARY_FOLDERS for p in (source / folder).rglob("*.py")}
  gin_root = source / "transformer" / "gin"
  source_gin = {str(p.relative_to(gin_root)) for p in gin_root.rglob("*.gin")}
  wheel_modules, wheel_gin = _wheel_contents(wheel)
  sdist_modules, sdist_gin = _sdist_contents(sdist)
  assert wheel_modules == source_modules, (
      source_modules ^ wheel_modules)
  assert sdist_modules == wheel_modules, sdist_modules ^ wheel_modules
  assert wheel_gin == source_gin, source_gin ^ wheel_gin
  assert sdist_gin == wheel_gin, sdist_gin ^ wheel_gin
  assert set(_build_library_modules()) <= wheel_modules
