"""Soak test of `pyspec serve`: --requests requests (default 500) through the openai client, with
--online on (the draft is distilled from the traffic and hot-reloaded every --online-interval
requests), the phrase pool saved to a --pool-file every --pool-save-interval seconds, a mix of
chat and completion, streamed and not, some with log-probabilities, some cancelled by their
client, from --clients concurrent clients. Reports failed requests (anything but a complete
answer, apart from the deliberate cancels), draft reloads, pool saves, and the server's resident
memory after the first 50 requests and at the end (the goal: 0 failures, end within 10% of the
first 50).

    python benchmarks/serve_soak.py --tiny --json benchmarks/results/serve_soak_tiny_paced.json

--tiny builds the tiny random-weight test models (fast); without it the default real pair is used.
To tell the causes of memory growth apart: every --sample-every requests the server's resident
memory (anonymous and file-backed), the phrase pool's phrases and bytes and the draft version go
in the report's timeline; --no-online and --no-pool-file leave out the online loop (training,
reloads) or the pool saves; --pool-capacity sets the pool's bound; --probe malloc adds glibc's
allocator totals (memory in use vs freed but kept), --probe tracemalloc also Python's
allocations and where they grew (benchmarks/soak_probe/sitecustomize.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
from pyspec.models import resolve_model

PROMPTS = [
    "def {name}(items):\n    \"\"\"Return the {what} of a list.\"\"\"\n",
    "Write a short Python function that computes the {what} of a list.",
    "Explain in two sentences what the {what} of a list is.",
    "class {Name}:\n    def __init__(self):\n        self.items = []\n\n    def {name}(self):\n",
]
WHATS = ["sum", "maximum", "median", "mode", "length", "product", "average", "reverse", "sorted copy"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_split_kib(pid: int) -> dict[str, int]:
    """Resident memory by kind (/proc/PID/smaps_rollup): anonymous (heap, malloc arenas, repacked
    weights) and file-backed (mapped GGUF files, shared libraries)."""
    split = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Anonymous", "Shared_Clean", "Private_Clean"):
                split[key] = int(rest.split()[0])
    return {"rss_kib": split.get("Rss", 0), "anon_kib": split.get("Anonymous", 0),
            "file_kib": split.get("Rss", 0) - split.get("Anonymous", 0)}


def probe_server(pid: int, path: Path, timeout: float = 120.0) -> dict[str, Any] | None:
    """Asks the server's memory probe (benchmarks/soak_probe) for a record; waits for its line."""
    n_before = len(path.read_text().splitlines()) if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) > n_before:
            return json.loads(lines[n_before])
        time.sleep(0.05)
    return None


def children(pid: int) -> list[int]:
    """Processes whose parent is pid (the online distiller's training process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def metric(base_url: str, name: str, labels: str = "") -> float:
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def one_request(client: openai.OpenAI, model: str, rng: random.Random, i: int) -> str:
    """Runs request i; returns its outcome ("ok", "cancelled") or raises on a failure."""
    what = rng.choice(WHATS)
    text = rng.choice(PROMPTS).format(name=what.replace(" ", "_"), Name=what.title().replace(" ", ""), what=what)
    max_tokens = rng.choice([16, 24, 32, 48])
    kind = i % 6
    common: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0 if i % 3 else 0.8,
                              "seed": i}
    if kind == 0:
        r = client.chat.completions.create(messages=[{"role": "user", "content": text}], **common)
        assert r.choices[0].finish_reason in ("stop", "length"), r
    elif kind == 1:
        got = list(client.chat.completions.create(messages=[{"role": "user", "content": text}], stream=True,
                                                  **common))
        assert got and got[-1].choices and got[-1].choices[0].finish_reason in ("stop", "length"), got[-1]
    elif kind == 2:
        r = client.completions.create(prompt=text, logprobs=2, **common)
        assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    elif kind == 3:
        got = list(client.completions.create(prompt=text, stream=True, **common))
        assert got[-1].choices[0].finish_reason in ("stop", "length")
    elif kind == 4:
        r = client.chat.completions.create(messages=[{"role": "user", "content": text}], logprobs=True,
                                           top_logprobs=3, extra_body={"method": rng.choice(["chain", "lookup", "auto"])},
                                           **common)
        assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    else:  # a client that goes away after the first chunks
        stream = client.chat.completions.create(messages=[{"role": "user", "content": text}], stream=True,
                                                **dict(common, max_tokens=200))
        for n, _ in enumerate(stream):
            if n == 2:
                break
        stream.close()
        return "cancelled"
    return "ok"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random-weight models instead of the real pair")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="server threads (default 1: training gets the other core)")
    p.add_argument("--online-interval", type=int, default=32, help="requests between draft updates (default 32)")
    p.add_argument("--pool-save-interval", type=float, default=5.0)
    p.add_argument("--pace", type=float, default=0.2,
                   help="seconds each client waits between requests (default 0.2: with the tiny models, slow "
                        "enough that draft updates keep up with the traffic)")
    p.add_argument("--no-online", action="store_true", help="serve without --online (no training, no reloads)")
    p.add_argument("--no-pool-file", action="store_true", help="serve without --pool-file (no pool saves)")
    p.add_argument("--pool-capacity", type=int, default=None, help="the server's --pool-capacity (default: its own)")
    p.add_argument("--sample-every", type=int, default=50,
                   help="requests between two samples of the server's memory and pool (default 50)")
    p.add_argument("--probe", choices=["malloc", "tracemalloc"], default=None,
                   help="at each sample, also the server's allocator totals (glibc mallinfo2) and, with "
                        "tracemalloc, its Python allocations and where they grew (benchmarks/soak_probe; slower, "
                        "and tracemalloc's own memory makes the resident-memory verdict meaningless)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="pyspec-soak-"))
    if args.tiny:
        from pyspec._models.tiny import build_tiny_model

        target = str(build_tiny_model(work / "target.gguf", seed=0))
        draft = str(build_tiny_model(work / "draft.gguf", seed=100, base_seed=0, perturb=0.1))
    else:
        target, draft = resolve_model(args.target), resolve_model(args.draft)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    log = open(work / "server.log", "w")
    command = [sys.executable, "-m", "pyspec.cli", "-v", "serve", "--target", target, "--draft", draft,
               "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads), "--n-ctx", "2048",
               "--model-name", "soak"]
    if not args.no_online:
        command += ["--online", "--online-interval", str(args.online_interval),
                    "--online-work-dir", str(work / "drafts")]
    if not args.no_pool_file:
        command += ["--pool-file", str(work / "pool.bin"), "--pool-save-interval", str(args.pool_save_interval)]
    if args.pool_capacity is not None:
        command += ["--pool-capacity", str(args.pool_capacity)]
    env = dict(os.environ)
    probe = work / "probe.jsonl"
    if args.probe:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent / "soak_probe"),
                                                          env.get("PYTHONPATH")]))
        env["PYSPEC_SOAK_PROBE"] = str(probe)
        env["PYSPEC_SOAK_PROBE_TRACEMALLOC"] = "1" if args.probe == "tracemalloc" else "0"
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (work / "server.log").read_text()
            try:
                if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
        outcomes: dict[str, int] = {"ok": 0, "cancelled": 0, "failed": 0}
        failures: list[str] = []
        memory: dict[str, Any] = {"timeline": []}

        def sample(done: int) -> dict[str, Any]:
            """The server's memory, pool and draft version now (after `done` requests)."""
            point = {"requests": done, "seconds": round(time.monotonic() - t0, 1), **rss_split_kib(server.pid),
                     "pool_phrases": metric(base_url, "pyspec_pool_phrases"),
                     "pool_bytes": metric(base_url, "pyspec_pool_bytes"),
                     "draft_version": metric(base_url, "pyspec_draft_version", '{slot=""}'),
                     "trainer_kib": [rss_kib(c) for c in children(server.pid)]}
            if args.probe:
                point["probe"] = probe_server(server.pid, probe)
            memory["timeline"].append(point)
            return point

        lock = threading.Lock()
        next_index = iter(range(args.requests))
        t0 = time.monotonic()

        def client_loop(seed: int) -> None:
            rng = random.Random(seed)
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                try:
                    outcome = one_request(client, "soak", rng, i)
                except Exception as exc:  # counted and reported: the soak's verdict
                    outcome = "failed"
                    with lock:
                        failures.append(f"request {i}: {type(exc).__name__}: {exc}")
                time.sleep(args.pace)
                with lock:
                    outcomes[outcome] += 1
                    done = sum(outcomes.values())
                    if done == 50:
                        memory["after_50_kib"] = rss_kib(server.pid)
                        memory["trainer_after_50_kib"] = [rss_kib(c) for c in children(server.pid)]
                    if done % args.sample_every == 0:
                        point = sample(done)
                        print(f"{done} requests, {point['seconds']:.0f} s, server RSS {point['rss_kib']} KiB "
                              f"(anonymous {point['anon_kib']}), pool {point['pool_phrases']:.0f} phrases "
                              f"{point['pool_bytes'] / 1e6:.2f} MB, draft v{point['draft_version']:.0f}, {outcomes}",
                              flush=True)

        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Let a running update finish so the last reload is counted.
        deadline = time.monotonic() + 300
        while metric(base_url, "pyspec_online_updating") and time.monotonic() < deadline:
            time.sleep(1)
        memory["end_kib"] = rss_kib(server.pid)
        memory["trainer_processes_kib"] = [rss_kib(c) for c in children(server.pid)]
        memory["end"] = sample(sum(outcomes.values()))
        report = {
            "models": "tiny" if args.tiny else f"{args.target} + {args.draft}",
            "requests": args.requests, "clients": args.clients, "seconds": time.monotonic() - t0,
            "outcomes": outcomes, "failures": failures[:20],
            "draft_version": metric(base_url, "pyspec_draft_version", '{slot=""}'),
            "requests_per_reload": args.requests / max(1.0, metric(base_url, "pyspec_online_updates_total")),
            "online_updates": metric(base_url, "pyspec_online_updates_total"),
            "online_failed_updates": metric(base_url, "pyspec_online_failed_updates_total"),
            "pool_saves": metric(base_url, "pyspec_pool_saves_total"),
            "pool_save_errors": metric(base_url, "pyspec_pool_save_errors_total"),
            "pool_phrases": metric(base_url, "pyspec_pool_phrases"),
            "pool_bytes": metric(base_url, "pyspec_pool_bytes"),
            "pool_capacity": metric(base_url, "pyspec_pool_capacity"),
            "settings": {"online": not args.no_online, "pool_file": not args.no_pool_file, "pace": args.pace,
                         "online_interval": args.online_interval, "pool_save_interval": args.pool_save_interval,
                         "pool_capacity": args.pool_capacity},
            "cancelled_by_server": metric(base_url, "pyspec_requests_total", '{endpoint="chat",outcome="cancelled"}'),
            "memory": memory,
            "rss_end_over_after_50": memory["end_kib"] / memory["after_50_kib"],
        }
    finally:
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        log.close()
    report["server_exit_code"] = code
    report["pool_file_after_exit"] = os.path.getsize(work / "pool.bin") if (work / "pool.bin").exists() else None
    report["work_dir"] = str(work)
    report["verdict"] = {"zero_failures": outcomes["failed"] == 0,
                         "rss_within_10_percent": report["rss_end_over_after_50"] <= 1.10}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(report["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
