"""Settings shared by the unit tests that run an inner pytest session under ``--deadline``."""

from __future__ import annotations

#: Seconds; a deadline the inner session's first test always starts within. Under a loaded CI (two
#: workers running torch) an in-process session once took 0.44 s to reach its first test, so a 0.3 s
#: deadline cut it before anything ran. A test meant to outlast it sleeps ``DEADLINE`` plus a margin.
DEADLINE = 3.0
