"""Which xdist group an oracle test belongs to under ``--dist loadgroup`` (pure; no pytest import).

Every run of a record (on the reference and on each port) is made once per worker and shared by all
the tests that read it (the ``runs`` fixture), and a port test reads the reference's run of the same
record: so a record's tests, on every engine, belong on one worker. One group per record rather than
per family lets the scheduler balance two workers: with one group per family, one worker ran d1 and
the execution family while the other ran the chat.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

#: Family marker -> the namespace of session runs its tests read, in the order a test carrying
#: several markers is matched: the port tests of test_port.py read the mtplx runs; the fault panel's
#: (marked port too) read their own.
RUN_NAMESPACES = {"faults": "faults", "mtplx_chat": "mtplx_chat", "mtplx": "mtplx", "port": "mtplx", "d1": "d1"}
#: Parameter names that carry a test's record: an object with ``.id``, a ``(record id, ...)`` tuple
#: (d1's ``(request, question)`` keys, ``(base, arm)`` red arms), or the id itself; the fault panel's
#: tests group by the pin their rows run on (``panel``), whose reference runs they share.
RECORD_PARAMS = ("record", "prompt", "key", "rid", "arm", "panel")


def record_group(markers: Container[str], params: Mapping[str, Any]) -> str | None:
    """``"<runs namespace>:<record id>"`` for an oracle test, the namespace alone when it has no record
    parameter, ``None`` for a test of no oracle family (unit tests go wherever a worker is free).

    ``markers``: the test's keywords (marker names among them); ``params``: its ``callspec.params``.
    """
    namespace = next((ns for marker, ns in RUN_NAMESPACES.items() if marker in markers), None)
    if namespace is None:
        return None
    for name in RECORD_PARAMS:
        if name in params:
            value = params[name]
            record = value.id if hasattr(value, "id") else value[0] if isinstance(value, tuple) else value
            return f"{namespace}:{record}"
    return namespace
