r"""`make demo`: the Transformer binary from training to serving.

Runs `python -m mesh_tensorflow.transformer.main` with the shipped gin files
to train a small encoder-decoder on the embedded addition task ("417+86" ->
"503") on 8 logical CPUs, data- and model-parallel (mesh batch:2 x model:4),
then evaluates it on held-out sums, decodes a few of them from a file,
exports a SavedModel and serves a request of a few sums from it: four runs
of the binary (train, eval, infer, export_infer), then the SavedModel loaded
by TensorFlow alone.

Random sums rarely carry far, so the held-out set is drawn in equal shares
by number of carries (0 to 3) and the eval step reports exact match for
each; the decoded and served sums include carries, each marked right or
wrong, and the run ends by saying what the model gets wrong. Each binary
run prints its command line, so it can be repeated by hand; a summary table
ends the run.

    python examples/transformer_demo.py [--model_dir=DIR] [--train_steps=N]
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time

# Quiet TensorFlow's C++ start-up lines in this process too (it imports TF
# to read the results).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

GIN_FILES = ["models/bi_base.gin", "models/tiny.gin", "problems/addition.gin",
             "layouts/2x2_dp_mp.gin", "addition_demo.gin"]
HELD_OUT_PER_CARRY = 2  # Held-out sums decoded from a file, per carry count.
MAX_DIGITS = 3  # problems/addition.gin's.
# Served after export: no carry, a carry into the hundreds, two, three.
SERVED = ["12+30", "250+250", "250+251", "57+68", "999+1"]


def _command(model_dir, *gin_params):
  command = [sys.executable, "-m", "mesh_tensorflow.transformer.main",
             f"--model_dir={model_dir}", "--verbosity=-1"]
  command += [f"--gin_file={f}" for f in GIN_FILES]
  command += [f"--gin_param={p}" for p in gin_params]
  return command


# TensorFlow's start-up lines, which say nothing about the demo.
_NOISE = ("WARNING: All log messages before absl::InitializeLog()",
          "cudart_stub.cc", "cpu_feature_guard.cc", "To enable the following",
          "rebuild TensorFlow with")


def _show(command):
  words = [shlex.quote(w) for w in command]
  lines = [" ".join(words[:3])] + words[3:]
  print("\n$ " + " \\\n    ".join(lines), flush=True)


def _run(command):
  """Runs a step of the demo, its stderr (progress, errors) shown without
  TensorFlow's start-up noise; returns (seconds, its stdout)."""
  _show(command)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  start = time.time()
  process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  stdout = []
  reader = threading.Thread(target=lambda: stdout.append(
      process.stdout.read()))
  reader.start()
  for line in process.stderr:
    if not any(noise in line for noise in _NOISE):
      sys.stderr.write("   " + line)
      sys.stderr.flush()
  process.wait()
  reader.join()
  if process.returncode:
    sys.exit(f"demo: the step above failed (exit status "
             f"{process.returncode})")
  return time.time() - start, "".join(stdout)


def _carry_text(n):
  return f"{n} carry" if n == 1 else f"{n} carries"


def _carries(inputs):
  from mesh_tensorflow.transformer.data import embedded_task  # pylint: disable=g-import-not-at-top
  a, b = inputs.split("+")
  return embedded_task.count_carries(int(a), int(b))


def _held_out_examples(per_carry):
  """The first `per_carry` held-out sums of each carry count."""
  from mesh_tensorflow.transformer.data import embedded_task  # pylint: disable=g-import-not-at-top
  examples = []
  for carries in range(MAX_DIGITS + 1):
    stream = embedded_task.addition_examples("validation", MAX_DIGITS,
                                             carries=carries)
    examples += [next(stream) for _ in range(per_carry)]
  return examples


def _mark(inputs, answer, target):
  verdict = "right" if answer == target else f"WRONG, expected {target}"
  return (f"   {inputs:>9} -> {answer:<5} ({_carry_text(_carries(inputs))}) "
          f"{verdict}")


def _by_carries(metrics):
  """{carry class label: exact match} from the eval metrics."""
  prefix = "exact_match_carries_"
  return {k[len(prefix):]: v for k, v in sorted(metrics.items())
          if k.startswith(prefix)}


def _metrics(eval_dir, step):
  """The metrics the eval step wrote for `step` (TensorBoard events)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # summary_iterator's deprecation notice says nothing about the demo.
  tf.get_logger().setLevel("ERROR")
  values = {}
  for path in tf.io.gfile.glob(os.path.join(eval_dir, "events.out.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      if event.step != step:
        continue
      for value in event.summary.value:
        tensor = tf.make_ndarray(value.tensor) if value.HasField(
            "tensor") else value.simple_value
        values[value.tag.rsplit("/", 1)[-1]] = float(tensor)
  return values


def _serve(export_dir, inputs):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  outputs = serve(inputs=tf.constant(inputs))["outputs"].numpy()
  return [o.decode("utf-8", errors="replace") for o in outputs]


def _eval_mistakes(eval_dir, step):
  """([(sum, answer, expected)] of the wrong decodes at `step`, the number
  of sums in the eval set)."""
  def lines(name):
    with open(os.path.join(eval_dir, name)) as f:
      return f.read().splitlines()
  inputs = lines("addition_inputs")
  return [(x, p, t) for x, t, p in zip(
      inputs, lines("addition_targets"),
      lines(f"addition_{step}_predictions")) if p != t], len(inputs)


def _verdict(by_carries, eval_mistakes, served, answers):
  """What the model gets wrong, from the eval set and the served sums."""
  mistakes, total = eval_mistakes
  wrong = [(q, a) for q, a in zip(served, answers)
           if a != str(sum(int(x) for x in q.split("+")))]
  if not mistakes and not wrong:
    return ("The model gets every held-out sum of the eval set right, "
            "whatever its carries, and every served sum.")
  text = "What it gets wrong:"
  if mistakes:
    weak = ", ".join(f"{k} carr{'y' if k == '1' else 'ies'} "
                     f"{1 - v:.1%} wrong" for k, v in by_carries.items()
                     if v < 1.0)
    shown = ", ".join(f"{x} -> {p} (expected {t})"
                      for x, p, t in mistakes[:4])
    text += (f" {len(mistakes)} of the {total} held-out sums ({weak}), "
             f"e.g. {shown}.")
  if wrong:
    text += " Served: " + ", ".join(f"{q} -> {a}" for q, a in wrong) + "."
  return (text + " Random sums rarely carry far, so long carries get the "
          "least training; --train_steps trains longer.")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", default="/tmp/mtf_transformer_demo")
  parser.add_argument("--train_steps", type=int, default=None,
                      help="default: addition_demo.gin's")
  args = parser.parse_args()
  model_dir = os.path.abspath(args.model_dir)
  if os.path.exists(model_dir):
    shutil.rmtree(model_dir)
  os.makedirs(model_dir)
  rows = []
  steps = ([f"utils.run.train_steps = {args.train_steps}"]
           if args.train_steps else [])

  print("1. Train a small Transformer on addition (8 logical CPUs, "
        "mesh batch:2 x model:4)")
  seconds, _ = _run(_command(model_dir, *steps))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  checkpoint = tf.train.latest_checkpoint(model_dir)
  step = int(checkpoint.rsplit("-", 1)[1])
  rows.append(("train", f"{seconds:.0f} s", f"{step} steps, {checkpoint}"))

  print("\n2. Evaluate: decode 500 held-out sums, 125 for each number of "
        "carries (0-3), exact match")
  seconds, _ = _run(_command(model_dir, *steps, "utils.run.mode = 'eval'",
                             "utils.run.dataset_split = 'validation'"))
  eval_dir = os.path.join(model_dir, "validation_eval")
  metrics = _metrics(eval_dir, step)
  exact = metrics.get("exact_match", float("nan"))
  by_carries = _by_carries(metrics)
  print("   carries  exact match")
  for label, value in by_carries.items():
    print(f"   {label:>7}  {value:.1%}")
  rows.append(("eval", f"{seconds:.0f} s",
               f"exact match {exact:.1%} (by carries: " + ", ".join(
                   f"{k}: {v:.1%}" for k, v in by_carries.items()) +
               f"), digit accuracy "
               f"{metrics.get('digit_accuracy', float('nan')):.1%}; "
               f"{eval_dir}"))

  print(f"\n3. Decode held-out sums from a file ({HELD_OUT_PER_CARRY} for "
        f"each number of carries)")
  examples = _held_out_examples(HELD_OUT_PER_CARRY)
  inputs_file = os.path.join(model_dir, "decode_inputs.txt")
  with open(inputs_file, "w") as f:
    f.write("".join(f"{inputs}\n" for inputs, _ in examples))
  outputs_prefix = os.path.join(model_dir, "decodes")
  seconds, _ = _run(_command(
      model_dir, *steps, "utils.run.mode = 'infer'",
      f"decode_from_file.input_filename = '{inputs_file}'",
      f"decode_from_file.output_filename = '{outputs_prefix}'"))
  with open(f"{outputs_prefix}-{step}") as f:
    decodes = f.read().splitlines()
  for (inputs, target), decoded in zip(examples, decodes):
    print(_mark(inputs, decoded, target))
  right = sum(d == t for (_, t), d in zip(examples, decodes))
  rows.append(("infer", f"{seconds:.0f} s",
               f"{right}/{len(examples)} right; {outputs_prefix}-{step}"))

  print("\n4. Export a SavedModel (serves on one CPU)")
  export_base = os.path.join(model_dir, "export")
  seconds, _ = _run(_command(model_dir, *steps,
                             "utils.run.mode = 'export_infer'",
                             f"utils.run.export_path = '{export_base}'"))
  export_dir = os.path.join(export_base, sorted(os.listdir(export_base))[-1])
  rows.append(("export", f"{seconds:.0f} s", export_dir))

  print("\n5. Serve one request of a few sums from the SavedModel")
  start = time.time()
  answers = _serve(export_dir, SERVED)
  served_right = 0
  for question, answer in zip(SERVED, answers):
    target = str(sum(int(x) for x in question.split("+")))
    served_right += answer == target
    print(_mark(question, answer, target))
  rows.append(("serve", f"{time.time() - start:.0f} s",
               f"{served_right}/{len(SERVED)} right: " + ", ".join(
                   f"{q}={a}" for q, a in zip(SERVED, answers))))

  print("\nSummary")
  width = max(len(r[2]) for r in rows)
  print(f"  {'step':<7} {'time':>6}  {'result':<{width}}")
  for name, seconds, result in rows:
    print(f"  {name:<7} {seconds:>6}  {result}")
  print(f"\nEverything is in {model_dir} (TensorBoard: tensorboard "
        f"--logdir {model_dir}).")
  print("\n" + _verdict(by_carries, _eval_mistakes(eval_dir, step), SERVED,
                        answers))
  if not exact >= 0.95:
    sys.exit(f"demo: exact match {exact:.1%} is below 95%")


if __name__ == "__main__":
  main()
