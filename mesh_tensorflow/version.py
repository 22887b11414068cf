"""The package's version: the one place setup.py and `mtf.__version__` read."""

__version__ = "0.2.0"
