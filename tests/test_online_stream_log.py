"""benchmarks/online_stream.py's update log: which requests an update followed.

A routed mode's distiller counts only its own domain's requests, so its updates' serving
intervals must be found by position in that domain, not by the stream's index (a GSM8K update
after its 8th request follows stream requests 50-57, not 0-7).
"""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "online_stream.py"


def load_script():
    spec = importlib.util.spec_from_file_location("online_stream_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream_records() -> list[dict]:
    """Two suites of 12 requests each, in stream order; serve_seconds = the stream index."""
    suites = ["humaneval"] * 12 + ["gsm8k"] * 12
    return [{"index": i, "suite": s, "serve_seconds": float(i)} for i, s in enumerate(suites)]


def test_a_domains_update_follows_its_own_requests():
    script = load_script()
    gsm8k = [r for r in stream_records() if r["suite"] == "gsm8k"]
    served = script.requests_before_update(gsm8k, started_after=8, interval=8)
    assert [r["index"] for r in served] == list(range(12, 20))
    served = script.requests_before_update(gsm8k, started_after=12, interval=8)
    assert [r["index"] for r in served] == list(range(16, 24))


def test_one_distiller_over_the_stream_counts_the_stream():
    script = load_script()
    served = script.requests_before_update(stream_records(), started_after=16, interval=8)
    assert [r["index"] for r in served] == list(range(8, 16))
    assert sum(r["serve_seconds"] for r in served) == sum(range(8, 16))


def test_a_shuffled_stream_draws_its_held_out_prompts_from_the_same_order(tmp_path, monkeypatch):
    """--shuffle SEED: each suite's prompts in one random order per seed, cut into the stream's
    and the held-out prompts (disjoint); without it, file order (MT-Bench's categories in turn)."""
    import json

    import pyspec.data

    questions = [{"question_id": 81 + i, "category": ["writing", "math"][i // 10], "turns": [f"question {i}"]}
                 for i in range(20)]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")

    def load_suite(name, n=None):
        return pyspec.data.load_suite_file(name, path, n)

    monkeypatch.setattr(pyspec.data, "load_suite", load_suite)
    script = load_script()

    def ids(part):
        return [prompt.split()[-1] for _, prompt in part]  # "question i" rendered raw

    stream, held_out = script.load_stream("mtbench:10", raw=True, held_out=4)
    assert ids(stream) == [str(i) for i in range(10)] and ids(held_out) == ["10", "11", "12", "13"]
    stream, held_out = script.load_stream("mtbench:10", raw=True, held_out=4, shuffle=1)
    again = script.load_stream("mtbench:10", raw=True, held_out=4, shuffle=1)
    assert (ids(stream), ids(held_out)) == (ids(again[0]), ids(again[1]))  # one order per seed
    assert len(stream) == 10 and len(held_out) == 4 and not set(ids(stream)) & set(ids(held_out))
    assert ids(stream) != [str(i) for i in range(10)]
    assert {int(i) >= 10 for i in ids(stream)} == {False, True}  # both categories served
    other = script.load_stream("mtbench:10", raw=True, held_out=4, shuffle=2)
    assert ids(other[0]) != ids(stream)
