"""An example third-party kernelhub backend (see README.md)."""

__version__ = "0.1.0"
