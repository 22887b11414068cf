"""Installs Mesh TensorFlow for TensorFlow 2.

Packages are found, not listed, so none can be left out: everything under
mesh_tensorflow/, and the top-level transformer/ folder installed as
`mesh_tensorflow.transformer` (the repository keeps the original's layout).
The Transformer's gin files, BERT's configurations and auto_mtf's machine
files ship as package data. The version is read from
mesh_tensorflow/version.py without importing the package.
"""

import pathlib
import re

import setuptools

ROOT = pathlib.Path(__file__).resolve().parent
# Folders installed under another package name: repository folder -> package.
RENAMED = {"transformer": "mesh_tensorflow.transformer"}


def _version():
  text = (ROOT / "mesh_tensorflow" / "version.py").read_text()
  match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
  if not match:
    raise RuntimeError("mesh_tensorflow/version.py sets no __version__.")
  return match.group(1)


def _packages():
  """Every package under mesh_tensorflow/ and the renamed folders."""
  packages = setuptools.find_packages(
      where=str(ROOT), include=["mesh_tensorflow", "mesh_tensorflow.*"])
  package_dir = {}
  for folder, name in RENAMED.items():
    for package in setuptools.find_packages(
        where=str(ROOT), include=[folder, folder + ".*"]):
      installed = name + package[len(folder):]
      packages.append(installed)
      package_dir[installed] = package.replace(".", "/")
  return sorted(packages), package_dir


PACKAGES, PACKAGE_DIR = _packages()

setuptools.setup(
    name="mesh-tensorflow-tf2",
    version=_version(),
    description=("Mesh TensorFlow: named-dimension distributed tensor "
                 "computation, re-created for TensorFlow 2."),
    license="Apache 2.0",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    # Read at run time: the original's gin configs (defaults.gin, models/,
    # layouts/, ...), found through importlib.resources (utils.py).
    package_data={
        "mesh_tensorflow.transformer": ["gin/*.gin", "gin/*/*.gin"],
        # BERT's model configurations (base.json, large.json, moe.json, ...).
        "mesh_tensorflow.bert": ["config/*.json"],
        # Machine constants of machines you may not have (tpu_v3_pod.json,
        # gpu_8x_node.json), for planning (auto_mtf.machine.shipped_machine).
        "mesh_tensorflow.auto_mtf": ["machines/*.json"],
    },
    install_requires=[
        "tensorflow>=2.16",
        "tensorflow-text",
        "tensorflow-datasets",
        "absl-py",
        "numpy",
        "gin-config",
    ],
    extras_require={
        # The layout search (mesh_tensorflow.auto_mtf) solves with CP-SAT.
        # 9.15 crashes (segfault in CpSolver.solve) in a process that
        # imported TensorFlow 2.21 first; 9.14 is the newest that does not.
        "auto_mtf": ["ortools>=9.14,<9.15"],
        # setuptools and wheel: tests/test_wheel.py builds the wheel offline.
        # sentencepiece 0.2.2+ is generated for protobuf 7, which the
        # auto_mtf extra's OR-tools (protobuf 6.31) rules out.
        "test": ["pytest", "pytest-xdist", "sentencepiece<0.2.2",
                 "setuptools", "wheel"],
    },
)
