"""Runs the Transformer binary of this checkout: `python -m
tests.cluster.transformer_main FLAGS...`.

`python -m mesh_tensorflow.transformer.main` would run the checkout the
package was installed from (an editable install maps the package to its
folder), which need not be this one (see tests/this_checkout.py).
"""

from tests import this_checkout

if __name__ == "__main__":
  this_checkout.import_transformer()
  from mesh_tensorflow.transformer import main  # pylint: disable=g-import-not-at-top
  main.console_entry_point()
