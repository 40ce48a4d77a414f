"""pytest-oracles: numerical reference oracles for LLM conversions, as a pytest plugin.

Nothing heavy is imported here: the plugin must load without torch, transformers or mlx.
"""

__version__ = "0.1.0"
