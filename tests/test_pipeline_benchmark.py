"""benchmarks/pipeline.py counts what it reports.

On a small LM (2 blocks, batch 16 x length 8) the counted figures of a
pipelined case, without running a step: the bubble counted from the
lowered program's iterations is GPipe's (S-1)/(M+S-1), and each processor
holds 1/S of the layer stack's weights.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent /
                       "benchmarks"))
import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position

ARGS = ["--blocks", "2", "--batch", "16", "--length", "8"]


def test_counted_bubble_and_weight_fraction():
  case, stages, fraction = "s2_m4", 2, 0.5
  args = pipeline.parse_args(ARGS)
  tokens = tf.constant(np.random.RandomState(0).randint(
      2, pipeline.VOCAB, size=(args.batch, args.length)).astype("int32"))
  figures = pipeline.static_figures(mtf, tf, case, args, tokens)
  assert figures["stages"] == stages
  assert figures["stack_weight_fraction"] == fraction
  assert figures["activation_mb"] > 0
  assert figures["iterations"] == 4 + stages - 1
  assert figures["bubble_counted"] == pytest.approx(
      (stages - 1) / (4 + stages - 1), abs=1e-4)
  assert figures["bubble_counted"] == figures["bubble_expected"]
