"""bench/engine_calls.py by the bare name bench/real_size.py imports it by: the bench puts bench/ on
sys.path, mypy names the file bench.engine_calls (see [tool.mypy] in pyproject.toml)."""

from bench.engine_calls import *  # noqa: F403 - the whole module, under its other name
