"""tests/unit/report_fake.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.report_fake (see [tool.mypy] in pyproject.toml)."""

from tests.unit.report_fake import *  # noqa: F403 - the whole module, under its other name
