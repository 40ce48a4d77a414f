"""tests/unit/processes.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.processes (see [tool.mypy] in pyproject.toml)."""

from tests.unit.processes import *  # noqa: F403 - the whole module, under its other name
