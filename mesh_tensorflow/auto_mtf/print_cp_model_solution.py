"""Prints a solved CP-SAT model: each named variable's value, the objective
as a sum of coefficient times variable, and its optimal value.

Reads the model's proto and the solver's response, as the original did,
through OR-tools' current API (`CpModel.proto`, `CpSolver.response_proto`,
`has_objective()`), falling back to the deprecated `Proto()`,
`ResponseProto()` and `HasField("objective")` of older releases.
"""


def print_solution(model, solver):
  """Prints the values and objective of `solver`'s solution of `model`.

  Args:
    model: an ortools.sat.python.cp_model.CpModel.
    solver: a cp_model.CpSolver on which Solve has found a solution.
  """
  proto = _model_proto(model)
  response = _response(solver)
  coefficients = {}
  maximize = False
  if _has_objective(proto):
    objective = proto.objective
    coefficients = dict(zip(objective.vars, objective.coeffs))
    maximize = objective.scaling_factor < 0
  values = []
  terms = []
  for index, variable in enumerate(proto.variables):
    if not variable.name:
      continue
    coefficient = coefficients.get(index, 0)
    if maximize:
      coefficient = -coefficient
    if coefficient:
      sign = "-" if coefficient < 0 else "+"
      terms.append(f" {sign} {abs(coefficient)} * {variable.name}")
    values.append(f"  {variable.name} = {response.solution[index]}\n")
  print("".join(values), end="")
  if terms and terms[0].startswith(" +"):
    terms[0] = terms[0][3:]
  print("{}:{}".format("Maximize" if maximize else "Minimize", "".join(terms)))
  print(f"Objective value: {solver.ObjectiveValue()}\n")


def _response(solver):
  """The solver's CpSolverResponse, through the current or the old API."""
  response = getattr(solver, "response_proto", None)
  if response is None:
    return solver.ResponseProto()
  return response() if callable(response) else response


def _model_proto(model):
  """The model's CpModelProto, through the current or the old API."""
  proto = getattr(model, "proto", None)
  return proto if proto is not None else model.Proto()


def _has_objective(proto):
  if hasattr(proto, "has_objective"):
    return proto.has_objective()
  return proto.HasField("objective")
