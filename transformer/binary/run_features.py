"""The features a Transformer run feeds its model.

Datasets carry more than the model reads (e.g. "inputs_pretokenized" text
kept for writing decodes); `filter_features` keeps the model's features.
The model function (`run_model_fn`) and the drivers of evaluation,
inference and scoring all use it, so it has a module of its own.
"""

# The features the model reads; others (e.g. "*_pretokenized") are dropped.
MODEL_FEATURES = ("inputs", "inputs_position", "inputs_segmentation",
                  "targets", "targets_position", "targets_segmentation",
                  "targets_subsegmentation")


def filter_features(example):
  """The example's model features (see MODEL_FEATURES)."""
  return {k: v for k, v in example.items() if k in MODEL_FEATURES}
