"""The LiteRT port (``litert``): a pin's ``.tflite`` in ai-edge-litert's interpreter.

:mod:`oracles.engines.litert.artifact` reads and checks the artifact's signatures without the runtime;
:mod:`oracles.engines.litert.engine` is the engine (:class:`~oracles.engines.litert.engine.LiteRtPort`).
The artifacts are made by :mod:`oracles.pins.litert` (``litert-convert:PIN`` pins).
"""
