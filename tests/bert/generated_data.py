"""The BERT tests' vocabulary and tiny configs: the package's example data.

`mesh_tensorflow.bert.example_data` generates what docs/bert.md's BERT
commands run on; the tests use the same vocabulary and configurations.
"""

# pylint: disable=wildcard-import,unused-wildcard-import
from mesh_tensorflow.bert.example_data import *  # noqa: F401,F403
