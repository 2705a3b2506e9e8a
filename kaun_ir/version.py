"""The package's version (``kn.__version__``), in a module of its own so tools can read it."""

__version__ = "0.1.0"
