"""A generated, MNIST-shaped data set of handwritten-looking digits.

The examples run without internet access, so when MNIST is not on disk
`examples/mnist.py` trains on these instead: 28x28 float32 images in [0, 1]
of the digits 0-9, each drawn from a pen-stroke template (polylines in a unit
box) under a random affine transform (scale, rotation, shear, shift), random
jitter of the control points, a random pen width and pixel noise. The data
depend only on the seed, so every run sees the same images.
"""

import numpy as np

IMAGE_SIZE = 28
NUM_CLASSES = 10


def _arc(cx, cy, rx, ry, start, stop, n=12):
  """Points of an elliptic arc; angles in degrees, 0 = right, 90 = down."""
  angles = np.radians(np.linspace(start, stop, n))
  return list(zip(cx + rx * np.cos(angles), cy + ry * np.sin(angles)))


# Strokes of each digit: lists of (x, y) points in [0, 1]^2, y pointing down.
TEMPLATES = {
    0: [_arc(0.5, 0.5, 0.3, 0.42, 0, 360, 24)],
    1: [[(0.35, 0.25), (0.55, 0.08), (0.55, 0.92)]],
    2: [_arc(0.5, 0.3, 0.28, 0.22, 180, 380) +
        [(0.2, 0.92), (0.82, 0.92)]],
    3: [_arc(0.48, 0.29, 0.27, 0.21, 200, 450),
        _arc(0.48, 0.7, 0.3, 0.22, 270, 520)],
    4: [[(0.65, 0.92), (0.65, 0.08), (0.18, 0.65), (0.85, 0.65)]],
    5: [[(0.78, 0.08), (0.3, 0.08), (0.26, 0.45)] +
        _arc(0.48, 0.65, 0.3, 0.27, 230, 500)],
    6: [[(0.72, 0.1), (0.45, 0.3)] + _arc(0.5, 0.67, 0.28, 0.25, 200, 560)],
    7: [[(0.18, 0.1), (0.82, 0.1), (0.42, 0.92)]],
    8: [_arc(0.5, 0.28, 0.24, 0.2, 0, 360, 20),
        _arc(0.5, 0.7, 0.3, 0.22, 0, 360, 20)],
    9: [_arc(0.5, 0.33, 0.28, 0.25, 0, 360, 20) +
        [(0.78, 0.33), (0.7, 0.92)]],
}


def _segments(digit, rng):
  """(start, end) arrays [n, 2] of a digit's strokes, transformed."""
  points, starts, ends = [], [], []
  for stroke in TEMPLATES[digit]:
    stroke = np.asarray(stroke, np.float64) - 0.5
    stroke = stroke + rng.normal(0, 0.025, size=stroke.shape)
    points.append(stroke)
  scale = rng.uniform(0.8, 1.1) * np.array([rng.uniform(0.8, 1.15), 1.0])
  angle = np.radians(rng.uniform(-15, 15))
  shear = rng.uniform(-0.25, 0.25)
  rotation = np.array([[np.cos(angle), -np.sin(angle)],
                       [np.sin(angle), np.cos(angle)]])
  matrix = rotation @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag(scale)
  # The digit fills a 20x20 box in the middle of the image, as in MNIST.
  center = IMAGE_SIZE / 2 + rng.uniform(-2.5, 2.5, size=2)
  for stroke in points:
    pixels = stroke @ matrix.T * 20 + center
    starts.append(pixels[:-1])
    ends.append(pixels[1:])
  return np.concatenate(starts), np.concatenate(ends)


def _render(starts, ends, width, grid):
  """Image of the segments: ink falls off with distance to the pen line."""
  direction = ends - starts  # [n, 2]
  length2 = np.maximum(np.sum(direction ** 2, axis=1), 1e-9)
  offset = grid[:, None, :] - starts[None]  # [pixels, n, 2]
  t = np.clip(np.sum(offset * direction[None], axis=2) / length2, 0, 1)
  nearest = starts[None] + t[..., None] * direction[None]
  distance = np.min(np.linalg.norm(grid[:, None, :] - nearest, axis=2),
                    axis=1)
  return np.clip(width - distance + 0.5, 0, 1)


def make_digits(num_examples, seed):
  """(images float32 [n, 28, 28] in [0, 1], labels int32 [n]).

  Labels cycle through 0-9 in a shuffled order, so classes are balanced.
  """
  rng = np.random.RandomState(seed)
  labels = rng.permutation(np.arange(num_examples) % NUM_CLASSES)
  ys, xs = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
  grid = np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], axis=1)
  images = np.empty([num_examples, IMAGE_SIZE * IMAGE_SIZE], np.float32)
  for i, label in enumerate(labels):
    starts, ends = _segments(int(label), rng)
    image = _render(starts, ends, rng.uniform(0.6, 1.6), grid)
    image = image * rng.uniform(0.7, 1.0) + rng.normal(0, 0.08, image.shape)
    images[i] = np.clip(image, 0, 1)
  return (images.reshape([num_examples, IMAGE_SIZE, IMAGE_SIZE]),
          labels.astype(np.int32))


def train_and_test(num_train, num_test, seed=0):
  """Disjoint train and test sets (different seeds)."""
  return (make_digits(num_train, seed=2 * seed + 1),
          make_digits(num_test, seed=2 * seed + 2))
