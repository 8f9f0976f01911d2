"""Version of the ``hybrid-kernels`` distribution (read by hatchling and the release check)."""

__version__ = "0.1.0"
