"""The oracle suite: the families' parametrized checks, shipped in the package so a project runs them on its
own pins with ``pytest --pyargs oracles.suite --pin NAME``."""
