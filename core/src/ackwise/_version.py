"""Hold the version of ackwise and of every distribution released with it.

This line is the one place the version is written: hatchling reads it when it builds any
distribution of the workspace (``[tool.hatch.version]`` in each pyproject.toml), and
``ackwise.__version__``, ``ackwise --version``, the worker registry and the traces read it
from here.  docs/versioning.md says why.
"""

__version__ = "0.1.0"
