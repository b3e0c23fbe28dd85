"""The engine's buffers in transparent huge pages: where the kernel gives them only to memory that
asks ("madvise" mode), the weights, KV cache and compute buffers llama.cpp allocates must end up
in 2 MiB pages (one-token decoding is 5-7% slower in 4 KiB pages, docs/troubleshooting.md),
as they do for llama.cpp's own tools under glibc's hugetlb tunable."""

from __future__ import annotations

from pathlib import Path

import pytest

from isolated import run_json

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# In a fresh process: the large anonymous mappings that loading the engine added, their resident
# size and how much of it is in huge pages (from /proc/self/smaps).
MEASURE = """
import json, re, sys
import pyspec

def large_anonymous():
    out, cur = {}, None
    for line in open("/proc/self/smaps"):
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \\S+ \\S+ \\S+ (\\d+)\\s*(\\S*)$", line.rstrip("\\n"))
        if head:
            start, end, inode, name = head.groups()
            big = int(inode) == 0 and not name and int(end, 16) - int(start, 16) >= 8 << 20
            cur = out.setdefault(start, [0, 0]) if big else None
        elif cur is not None and line.startswith("Anonymous:"):
            cur[0] = int(line.split()[1])
        elif cur is not None and line.startswith("AnonHugePages:"):
            cur[1] = int(line.split()[1])
    return out

before = large_anonymous()
engine = pyspec.Engine(sys.argv[1], n_ctx=4096, n_threads=2, huge_pages=sys.argv[2] == "on")
engine.generate("def add(a, b):", max_tokens=4, method="none")
added = [v for k, v in large_anonymous().items() if k not in before]
print(json.dumps({"anonymous_kb": sum(a for a, _ in added), "huge_kb": sum(h for _, h in added)}))
"""


@pytest.mark.model
@pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_the_engines_buffers_are_in_huge_pages() -> None:
    """SmolLM2-135M (its KV cache and compute buffers are about as large as its weights): at
    least half of what loading it added is in huge pages (all of it in the runs seen; 14 of 117
    MB if the weights' buffers are advised at the load's first progress callback only and the
    context's buffers collapsed in one call)."""
    from pyspec.models import resolve_model

    path = str(resolve_model("smollm2-135m-instruct"))
    on = run_json(MEASURE, path, "on")
    assert on["anonymous_kb"] > 64 << 10, on  # the buffers were found
    assert on["huge_kb"] >= on["anonymous_kb"] // 2, on
    if "[madvise]" in THP.read_text():  # only what asks gets them: off leaves the buffers in 4 KiB pages
        off = run_json(MEASURE, path, "off")
        assert off["huge_kb"] < on["huge_kb"] // 4, (on, off)
