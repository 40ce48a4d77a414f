"""tests/unit/artifact_files.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.artifact_files (see [tool.mypy] in pyproject.toml)."""

from tests.unit.artifact_files import *  # noqa: F403 - the whole module, under its other name
