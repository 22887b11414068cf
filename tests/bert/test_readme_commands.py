"""The BERT commands of docs/bert.md, run as a new user would, at a small size.

The block goes through bash as written (example data, pretraining
records, pretraining, MRPC and SQuAD fine-tuning from the pretraining
checkpoint, on the meshes it names), with its folder in tmp_path and its
step counts cut: this checks that every command and flag works and writes
what docs/bert.md says, not how well the model learns (tests/bert/
test_run_*.py do that).
"""

import json

from tests import readme_testing

BLOCK = "python -m mesh_tensorflow.bert.example_data --output_dir=$D"


def test_readme_bert_commands(tmp_path):
  script = readme_testing.block(BLOCK)
  script = readme_testing.replace_once(script, "D=/tmp/bert_example",
                                       f"D={tmp_path}/bert_example")
  for old, new in (("--num_train_steps=400", "--num_train_steps=10"),
                   ("--steps_per_eval=400", "--steps_per_eval=10"),
                   ("--max_eval_steps=20", "--max_eval_steps=2"),
                   ("--num_train_epochs=4", "--num_train_epochs=0.25"),
                   ("--num_train_epochs=16", "--num_train_epochs=0.5")):
    script = readme_testing.replace_once(script, old, new)
  readme_testing.run_shell(tmp_path, script)
  example = tmp_path / "bert_example"
  pretrained = (example / "pretrained" / "eval_results.txt").read_text()
  assert "global_step = 10" in pretrained and "masked_lm_accuracy" in (
      pretrained)
  assert "eval_accuracy" in (example / "mrpc" / "eval_results.txt").read_text()
  lines = (example / "mrpc" / "test_results.tsv").read_text().splitlines()
  assert len(lines) == 20 and all(len(l.split("\t")) == 2 for l in lines)
  squad = example / "squad"
  predictions = json.loads((squad / "predictions.json").read_text())
  assert len(predictions) == 60
  assert set(json.loads((squad / "nbest_predictions.json").read_text())) == (
      set(predictions))
  scores = json.loads((squad / "eval_results.json").read_text())
  assert 0 <= scores["exact_match"] <= 100 and 0 <= scores["f1"] <= 100
