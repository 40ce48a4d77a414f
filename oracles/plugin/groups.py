"""Which xdist group an oracle test belongs to under ``--dist loadgroup`` (pure; no pytest import).

Every run of a record (on the reference and on each port) is made once per worker and shared by all
the tests that read it (the ``runs`` fixture), and a port test reads the reference's run of the same
record: so a record's tests, on every engine, belong on one worker. One group per record rather than
per family lets the scheduler balance two workers: with one group per family, one worker ran d1 and
the execution family while the other ran the chat.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

from oracles.families import family_of

#: Parameter names that carry a test's record: an object with ``.id``, a ``(record id, ...)`` tuple
#: (d1's ``(request, question)`` keys, ``(base, arm)`` red arms), or the id itself.
RECORD_PARAMS = ("record", "prompt", "key", "rid", "arm")


def record_group(markers: Container[str], params: Mapping[str, Any]) -> str | None:
    """``"<runs namespace>:<pin>:<record id>"`` for an oracle test (``<pin>:`` when it has a ``pin``
    parameter, then ``<engine>:`` for a family whose runs are made per engine; the namespace is its
    family's :attr:`~oracles.families.Family.runs`), the namespace
    (and pin) alone when it has no record parameter, ``None`` for a test of no oracle family (unit tests
    go wherever a worker is free).

    ``markers``: the test's keywords (marker names among them); ``params``: its ``callspec.params``.
    """
    family = family_of(markers)
    if family is None:
        return None
    namespace = family.runs + (f":{params['pin']}" if isinstance(params.get("pin"), str) else "")
    if isinstance(params.get("port_pin"), str) and params["port_pin"] != params.get("pin"):
        namespace += f">{params['port_pin']}"  # another artifact's runs: its own group, so workers share them
    if family.per_engine and isinstance(params.get("engine_id"), str):
        namespace += f":{params['engine_id']}"
    for name in RECORD_PARAMS:
        if name in params:
            value = params[name]
            record = value.id if hasattr(value, "id") else value[0] if isinstance(value, tuple) else value
            return f"{namespace}:{record}"
    return namespace
