"""tests/unit/port_figures.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.port_figures (see [tool.mypy] in pyproject.toml)."""

from tests.unit.port_figures import *  # noqa: F403 - the whole module, under its other name
