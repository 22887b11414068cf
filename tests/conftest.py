"""Test set-up: 8 logical CPU devices, configured once per process.

It also makes `mesh_tensorflow.transformer` the `transformer/` folder of this
checkout (see this_checkout).
"""

from tests import mtf_testing
from tests import this_checkout

mtf_testing.configure_logical_devices()
this_checkout.import_transformer()
