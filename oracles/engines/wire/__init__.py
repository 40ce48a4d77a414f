"""The wire: the Engine contract carried call by call to a far side in any language, on any machine
(``docs/wire.md``). A far side is an engine ``wire:NAME`` that a project's ini file names
(:mod:`oracles.engines.wire.config`): a command the suite starts (stdio) or a host it connects to (TCP).

- :mod:`~oracles.engines.wire.frame`: one message: a prefix, a JSON header, the raw arrays;
- :mod:`~oracles.engines.wire.calls`: the call table (every carried Engine method, its arguments' and
  result's kinds); :mod:`~oracles.engines.wire.codec`: those kinds to and from JSON and arrays;
- :mod:`~oracles.engines.wire.transport`: subprocess stdio and TCP, with deadlines; no far side outlives
  the process that started it; :mod:`~oracles.engines.wire.channel`: a request and its response, failures
  in one line;
- :mod:`~oracles.engines.wire.client`: the far side as an ``Engine``; :mod:`~oracles.engines.wire.server`:
  a built engine answering the wire (``oracles serve``); :mod:`~oracles.engines.wire.conformance`: the
  checks of ``oracles wire-check``.

Nothing here imports a framework: numpy and the standard library (jinja2 where a chat is rendered).
"""
