"""tests/unit/report_dom.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.report_dom (see [tool.mypy] in pyproject.toml)."""

from tests.unit.report_dom import *  # noqa: F403 - the whole module, under its other name
