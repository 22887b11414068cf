"""The error types of the cluster package.

They live apart from the code that raises them, as the core's do in
`mesh_tensorflow.errors`, so that every module of the package can raise
them without importing another. `runtime.ClusterError` and
`spec.ClusterSpecError` remain importable under those names.
"""


class ClusterSpecError(ValueError):
  """A cluster spec (TF_CONFIG or flags) that cannot describe a cluster."""


class ClusterError(RuntimeError):
  """A task of the cluster cannot be reached or failed while running.

  Attributes:
    task: the spec.Task at fault, or None if TensorFlow did not say.
  """

  def __init__(self, message, task=None):
    super().__init__(message)
    self.task = task
