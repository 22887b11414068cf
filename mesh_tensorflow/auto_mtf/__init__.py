"""Automatic layout: picks the layout rules (and mesh shape) of a graph.

`layout(graph, mesh_shape, outputs)` returns the mtf.LayoutRules with the
least peak memory per processor, as the original's auto_mtf did;
`objective="time"` instead picks the least predicted step time whose peak
fits `memory_budget`. `layout_and_mesh_shape` also chooses among the mesh
shapes of a processor count. `allow_uneven=True` also considers splits a
mesh dimension does not divide (padded, with the padding priced), and
returns rules that allow them. `plan(model, num_processors,
memory_budget)` plans a whole run: mesh shape, layout, weight-update
sharding, pipeline stages, micro-batches and recompute (planner; `python
-m mesh_tensorflow.auto_mtf.plan` plans for a machine you do not have).
The search needs OR-tools (the `auto_mtf` extra); importing this package
does not.
"""

from mesh_tensorflow.auto_mtf import api
from mesh_tensorflow.auto_mtf import graph_interface
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import plan_pricing
from mesh_tensorflow.auto_mtf import plan_space
from mesh_tensorflow.auto_mtf import planner
from mesh_tensorflow.auto_mtf import print_cp_model_solution
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.auto_mtf import valid_layouts
from mesh_tensorflow.auto_mtf.api import layout
from mesh_tensorflow.auto_mtf.api import layout_and_mesh_shape
from mesh_tensorflow.auto_mtf.plan_space import GraphModel
from mesh_tensorflow.auto_mtf.plan_space import PlanModel
from mesh_tensorflow.auto_mtf.plan_space import Structure
from mesh_tensorflow.auto_mtf.planner import Plan
from mesh_tensorflow.auto_mtf.planner import plan
from mesh_tensorflow.auto_mtf.planner import PlanError
