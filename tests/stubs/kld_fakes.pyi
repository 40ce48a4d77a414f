"""tests/unit/kld_fakes.py by the bare name tests/unit's modules import it by: pytest puts tests/unit on
sys.path, mypy names the file tests.unit.kld_fakes (see [tool.mypy] in pyproject.toml)."""

from tests.unit.kld_fakes import *  # noqa: F403 - the whole module, under its other name
