"""Version of the ``confluent-bank`` distribution (read by hatchling and the release check)."""

__version__ = "0.1.0"
