"""The ONNX Runtime port (``onnxruntime``): a pin's ``.onnx`` in an ``InferenceSession`` on the CPU provider.

:mod:`oracles.engines.onnx.artifact` reads and checks the graph without the runtime (the ``onnx``
package); :mod:`oracles.engines.onnx.engine` is the engine
(:class:`~oracles.engines.onnx.engine.OnnxRuntimePort`). The artifacts are made by
:mod:`oracles.pins.onnx_export` (``onnx-export:PIN`` pins).
"""
