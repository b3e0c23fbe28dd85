"""ReDrafter draft heads: a small recurrent network on the target's hidden state (method
"redrafter"). Training data made by the target (`data`), the PyTorch module (`model`), training
(`train`), the head GGUF the engine loads (`gguf_io`); `pyspec train-head` is pyspec.cli.train_head.

Needs PyTorch for `model`, `train` and `gguf_io`; `import pyspec` imports only `known` (the heads
remembered per target, which an Engine loads by default; no torch).
"""
