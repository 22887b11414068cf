"""models/bi_moe.gin and models/lm_moe.gin (shrunk by models/tiny.gin)
train end to end through the binary, with the experts split over the
mesh dimension that splits the batch."""

import pytest
import tensorflow as tf

from tests.transformer import test_main

MOE = [
    "MoE1D.num_experts = 4", "MoE1D.hidden_size = 16",
    "MoE1D.group_size = 16",
    "utils.run.layout_rules = 'batch:batch,d_ff:model,heads:model,"
    "vocab:model,experts:batch'",
    "utils.run.train_steps = 3", "utils.run.iterations_per_loop = 3",
    "utils.run.save_checkpoints_steps = 3",
]


@pytest.mark.parametrize("model_file,model_type", [
    ("models/bi_moe.gin", "bitransformer"),
    ("models/lm_moe.gin", "delimited_lm")])
def test_moe_gin_trains_end_to_end(tmp_path, model_file, model_type):
  files = [model_file, "models/tiny.gin", "problems/addition.gin"]
  # problems/addition.gin asks for a bitransformer; the language model
  # reads each sum as one text (inputs, then targets).
  params = [f"run.model_type = '{model_type}'"]
  if model_type == "delimited_lm":
    params += ["embedded_task.addition_train_dataset_fn.pack = True",
               "Unitransformer.max_length = 16"]  # inputs + targets
  test_main.run_main(tmp_path, "run.mode = 'train'", *params, *MOE,
                     files=files)
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-3")
  config = (tmp_path / "operative_config.gin").read_text()
  assert "MoE1D.num_experts = 4" in config
  reader = tf.train.load_checkpoint(str(tmp_path))
  shapes = reader.get_variable_to_shape_map()
  experts = {n: shape for n, shape in shapes.items()
             if n.endswith("/MoE1D/wi/kernel")}
  assert experts, sorted(shapes)
  # [experts, d_model, hidden]: test_main's d_model, the bindings above.
  assert all(shape == [4, 16, 16] for shape in experts.values()), experts
  assert any(n.endswith("/MoE1D/top_2_gating/kernel") for n in shapes)
