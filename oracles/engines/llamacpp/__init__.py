"""The llama.cpp port (engine id ``llamacpp``): :mod:`.engine` (the Engine), :mod:`.runtime` (model and
contexts through the C API), :mod:`.tokenizer` (llama.cpp's tokenizer and chat rendering), :mod:`.native`
(opening the wheel's libllama). Nothing here imports the library at import time."""
