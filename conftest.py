"""This repository's own tests drive the plugin through pytester (tests/unit); the shared oracle
fixtures live in the plugin (oracles/plugin/fixtures.py), so a project with pytest-oracles installed has them
too. pytest refuses ``pytest_plugins`` in a non-root conftest, hence here."""

pytest_plugins = ["pytester"]
