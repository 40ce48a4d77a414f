"""tests/unit/source_trees.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.source_trees (see [tool.mypy] in pyproject.toml)."""

from tests.unit.source_trees import *  # noqa: F403 - the whole module, under its other name
