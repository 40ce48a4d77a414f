"""tests/unit/docs_check.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.docs_check (see [tool.mypy] in pyproject.toml)."""

from tests.unit.docs_check import *  # noqa: F403 - the whole module, under its other name
