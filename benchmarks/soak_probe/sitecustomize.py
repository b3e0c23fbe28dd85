"""Memory probe for `benchmarks/serve_soak.py --probe` (not part of pyspec).

serve_soak.py puts this folder on the server's PYTHONPATH, so Python imports this file at
startup; it acts only in the `python -m pyspec.cli ... serve` process and only when
PYSPEC_SOAK_PROBE names an output file (it removes the variable, so the training process started
by the server does not inherit it). Each SIGUSR1 then appends one JSON line to that file: the
process's resident memory by kind (/proc/self/smaps_rollup), glibc's allocator totals over all
arenas (mallinfo2: `arena` bytes taken from the system, `uordblks` in use, `fordblks` free but
kept, `hblkhd` in blocks mapped on their own), and with PYSPEC_SOAK_PROBE_TRACEMALLOC=1 the
Python allocations (tracemalloc, started here) and the 15 places whose allocations grew most
since the first line. Free-but-kept arena memory that grows while the memory in use does not is
the allocator keeping freed pages; tracemalloc's totals tell Python-side growth apart.
"""

import os
import sys

if os.environ.get("PYSPEC_SOAK_PROBE") and sys.argv[:1] == ["-m"] and "serve" in sys.argv:
    import ctypes
    import json
    import signal
    import threading
    import tracemalloc

    _out = os.environ.pop("PYSPEC_SOAK_PROBE")
    _trace = os.environ.pop("PYSPEC_SOAK_PROBE_TRACEMALLOC", "0") == "1"
    if _trace:
        tracemalloc.start(6)

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    _libc = ctypes.CDLL("libc.so.6")
    _libc.mallinfo2.restype = _Mallinfo2
    _first: list[tracemalloc.Snapshot] = []
    _wanted = threading.Event()

    def _smaps_kib() -> dict[str, int]:
        found = {}
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    found[key] = int(rest.split()[0])
        return {"rss_kib": found["Rss"], "anon_kib": found["Anonymous"]}

    def _record() -> dict[str, object]:
        info = _libc.mallinfo2()
        record: dict[str, object] = {**_smaps_kib(), "malloc": {
            "arena": info.arena, "in_use": info.uordblks, "free_kept": info.fordblks, "own_mmap": info.hblkhd}}
        if _trace:
            snapshot = tracemalloc.take_snapshot()
            record["python_traced"] = tracemalloc.get_traced_memory()[0]
            if not _first:
                _first.append(snapshot)
            else:
                record["python_growth"] = [
                    {"bytes": d.size_diff, "blocks": d.count_diff, "where": str(d.traceback[0])}
                    for d in snapshot.compare_to(_first[0], "lineno")[:15]]
        return record

    def _writer() -> None:
        while True:
            _wanted.wait()
            _wanted.clear()
            with open(_out, "a") as f:
                f.write(json.dumps(_record()) + "\n")

    threading.Thread(target=_writer, name="soak-probe", daemon=True).start()
    signal.signal(signal.SIGUSR1, lambda *_: _wanted.set())
