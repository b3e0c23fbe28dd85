#!/usr/bin/env python3
"""Builds llama.cpp's own llama-completion, llama-speculative-simple and llama-bench once, for
`pyspec bench`'s llama.cpp peers.

They come from the llama.cpp tree (commit 0c1e570) vendored in the llama-cpp-python 0.3.36
source distribution, the one whose libllama the engine links: `pip download` fetches the sdist
(sha256-checked), CMake builds the three tools (Release, static, native CPU: ~10 minutes on 2
cores) into $PYSPEC_CACHE/llama.cpp/0c1e570/bin (default ~/.cache/pyspec). Needs cmake and a
C/C++ compiler; without them, or when the build fails, it says why and exits with status 1
(`pyspec bench` then skips the llama.cpp peers with the same advice).

    python benchmarks/build_llama_cpp.py [--jobs N] [--force]
"""

import sys

from pyspec.bench.llamacpp import main

if __name__ == "__main__":
    sys.exit(main())
