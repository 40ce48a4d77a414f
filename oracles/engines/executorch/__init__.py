"""The ExecuTorch port (``executorch``): a pin's ``.pte`` in ExecuTorch's Python runtime.

:mod:`oracles.engines.executorch.artifact` reads and checks the program's facts without the runtime;
:mod:`oracles.engines.executorch.engine` is the engine (:class:`~oracles.engines.executorch.engine.ExecuTorchPort`).
The artifacts are made by :mod:`oracles.pins.executorch` (``executorch-convert:PIN`` pins).
"""
