"""Prompt-set loaders: small synthetic files in each source format, plus the real sets (`model`)."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest

from pyspec import data
from pyspec.cli import data as cli_data
from pyspec.data import Prompt, iter_json_array, load_suite, load_suite_file
from pyspec.fetch import Cache, PipDownloader
from pyspec.models import Registry

HUMANEVAL = [
    {
        "task_id": f"HumanEval/{i}",
        "prompt": f'def f{i}(x: int) -> int:\n    """Return x plus {i}."""\n',
        "canonical_solution": f"    y = x + {i}\n    return y\n",
        "entry_point": f"f{i}",
        "test": "",
    }
    for i in range(4)
]
MTBENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
]
GSM8K = [
    {"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = 5\n#### 5"},
    {"question": "A train goes 60 km/h for 2 h. How far?", "answer": "#### 120"},
]
SHAREGPT = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "Hello [there], {friend}!"},
                                    {"from": "gpt", "value": "Hi."}]},
    {"id": "b_1", "conversations": [{"from": "gpt", "value": "a continuation"},
                                    {"from": "human", "value": "skipped"}]},
    {"id": "c_0", "conversations": []},
    {"id": "d_0", "conversations": [{"from": "system", "value": "Be brief."},
                                    {"from": "human", "value": "  What is \u00e9t\u00e9?  "}]},
    {"id": "e_0", "conversations": [{"from": "human", "value": "last one"}]},
]


def _write_jsonl(path: Path, records: list[dict], gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def _write_truncated_sharegpt(path: Path) -> Path:
    """Pretty-printed like the real file, cut in the middle of the last record."""
    text = json.dumps(SHAREGPT, indent=2, ensure_ascii=False)
    cut = text.rindex('"last one"') + 4
    path.write_text(text[:cut], encoding="utf-8")
    return path


def test_prompt_renders_raw_or_chat() -> None:
    p = Prompt(id="x/1", suite="x", text="hi", messages=[{"role": "user", "content": "hi"}])
    assert p.render(chat=False) == "hi"
    assert p.render(chat=True) == [{"role": "user", "content": "hi"}]


def test_humaneval_prompts(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "HumanEval.jsonl.gz", HUMANEVAL, gz=True)
    prompts = load_suite_file("humaneval", path)
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(4)]
    first = prompts[0]
    assert first.suite == "humaneval" and first.text == HUMANEVAL[0]["prompt"]
    assert [m["role"] for m in first.messages] == ["user"]
    assert HUMANEVAL[0]["prompt"].rstrip() in first.messages[0]["content"]
    assert "canonical_solution" in first.meta
    assert len(load_suite_file("humaneval", path, n=2)) == 2
    assert load_suite_file("humaneval", path, n=0) == []


def test_edit_prompts_contain_the_solution_and_cycle_kinds(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "HumanEval.jsonl", HUMANEVAL)
    prompts = load_suite_file("edit", path)
    assert [p.meta["kind"] for p in prompts] == ["comments", "rename", "type-hints", "comments"]
    for task, p in zip(HUMANEVAL, prompts):
        assert p.id == f"edit/{task['task_id']}/{p.meta['kind']}"
        assert task["prompt"] + task["canonical_solution"] in p.text
        assert p.messages == [{"role": "user", "content": p.text}]
        assert "```python" in p.text


def test_mtbench_first_turns(tmp_path: Path) -> None:
    prompts = load_suite_file("mtbench", _write_jsonl(tmp_path / "q.jsonl", MTBENCH))
    assert [(p.id, p.text, p.meta["category"]) for p in prompts] == [
        ("mtbench/81", "Write a poem.", "writing"),
        ("mtbench/82", "What is 2+2?", "math"),
    ]
    assert prompts[1].messages == [{"role": "user", "content": "What is 2+2?"}]


def test_gsm8k_questions(tmp_path: Path) -> None:
    prompts = load_suite_file("gsm8k", _write_jsonl(tmp_path / "test.jsonl", GSM8K))
    assert [p.id for p in prompts] == ["gsm8k/0", "gsm8k/1"]
    assert prompts[0].text == GSM8K[0]["question"]
    assert prompts[0].meta["answer"].endswith("#### 5")


@pytest.mark.parametrize("chunk_chars", [7, 64, 1 << 20])
def test_truncated_json_array_is_read_record_by_record(tmp_path: Path, chunk_chars: int) -> None:
    path = _write_truncated_sharegpt(tmp_path / "sharegpt.json")
    records = list(iter_json_array(path, chunk_chars=chunk_chars))
    assert [r["id"] for r in records] == ["a_0", "b_1", "c_0", "d_0"]  # e_0 is cut off


def test_complete_json_array(tmp_path: Path) -> None:
    path = tmp_path / "full.json"
    path.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    assert len(list(iter_json_array(path, chunk_chars=5))) == len(SHAREGPT)


def test_sharegpt_first_human_turns(tmp_path: Path) -> None:
    path = _write_truncated_sharegpt(tmp_path / "sharegpt.json")
    prompts = load_suite_file("sharegpt", path)
    assert [(p.id, p.text) for p in prompts] == [
        ("sharegpt/a_0", "Hello [there], {friend}!"),
        ("sharegpt/d_0", "What is \u00e9t\u00e9?"),
    ]
    assert load_suite_file("sharegpt", path, n=1)[0].id == "sharegpt/a_0"
    # The first reply is kept as the reference answer (teacher-forced head training data).
    assert [p.meta["answer"] for p in prompts] == ["Hi.", ""]


def test_unknown_suite_lists_suites() -> None:
    with pytest.raises(ValueError, match="humaneval.*sharegpt"):
        load_suite("squad")


def test_load_suite_fetches_its_file_through_pip(tmp_path: Path) -> None:
    """The fetch path: a wheel holding the data set, pip download from a local directory."""
    payload = "".join(json.dumps(r) + "\n" for r in MTBENCH).encode()
    member = "pyspec_test_mtbench/data/question.jsonl"
    index = tmp_path / "index"
    index.mkdir()
    wheel = index / "pyspec_test_mtbench-2.0-py3-none-any.whl"
    info = "pyspec_test_mtbench-2.0.dist-info"
    metadata = "Metadata-Version: 2.1\nName: pyspec-test-mtbench\nVersion: 2.0\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", metadata)
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    registry = Registry.from_dict({"models": {}, "datasets": {"mtbench": {
        "package": "pyspec-test-mtbench", "version": "2.0", "member": member,
        "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}})
    cache = Cache(tmp_path / "cache")
    pip_args = ["--no-index", "--find-links", str(index)]

    dl = PipDownloader(cache.packages, pip_args)
    prompts = load_suite("mtbench", cache=cache, registry=registry, downloader=dl)
    assert [p.id for p in prompts] == ["mtbench/81", "mtbench/82"]
    assert dl.downloaded == ["pyspec-test-mtbench==2.0"]
    assert (cache.data / "mtbench" / "question.jsonl").read_bytes() == payload

    again = PipDownloader(cache.packages, pip_args)
    assert len(load_suite("mtbench", 1, cache=cache, registry=registry, downloader=again)) == 1
    assert again.downloaded == []

    (cache.data / "mtbench" / "question.jsonl").write_bytes(payload[:10])  # partial file
    assert len(load_suite("mtbench", cache=cache, registry=registry, downloader=again)) == 2
    assert again.downloaded == []  # re-extracted from the cached wheel


def test_registry_datasets_cover_every_suite() -> None:
    registry = Registry.load()
    for suite in data.SUITES.values():
        part = registry.datasets[suite.dataset]
        assert re.fullmatch(r"[0-9a-f]{64}", part.sha256) and part.size > 0


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pyspec")
    cli_data.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in data.SUITES)


# ----------------------------------------------------------------------------------------------
# The real prompt sets (fetched from PyPI packages into $PYSPEC_CACHE)


@pytest.mark.model
def test_real_prompt_sets() -> None:
    counts = {name: len(load_suite(name)) for name in data.SUITES}
    assert counts["humaneval"] == 164 and counts["edit"] == 164
    assert counts["mtbench"] == 80 and counts["gsm8k"] == 1319
    assert counts["sharegpt"] > 10_000
    for name in data.SUITES:
        prompts = load_suite(name, 5)
        assert len(prompts) == 5 and len({p.id for p in prompts}) == 5
        assert all(p.text and p.messages[0]["role"] == "user" for p in prompts)


@pytest.mark.model
def test_real_cli_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["data", "show", "edit", "2", "--chat"]) == 0
    out = capsys.readouterr().out
    assert "=== edit/HumanEval/0/comments" in out and "=== edit/HumanEval/1/rename" in out
    assert "def has_close_elements" in out


def _long_records(n: int, body_lines: int = 60) -> list[dict]:
    """n HumanEval-like tasks of ~1,000 characters each; tasks 3 and 5 share a function name."""
    records = []
    for i in range(n):
        name = "shared_name" if i in (3, 5) else f"task{i}"
        body = "".join(f"    x{k} = x + {k}\n" for k in range(body_lines))
        records.append({"task_id": f"HumanEval/{i}", "prompt": f'\n\ndef {name}(x: int) -> int:\n    """Task {i}."""\n',
                        "canonical_solution": body + "    return x\n", "entry_point": name, "test": ""})
    return records


@pytest.mark.parametrize("suite", ["longedit", "longqa"])
def test_long_suites_ask_about_one_function_defined_once_in_a_long_module(tmp_path: Path, suite: str) -> None:
    records = _long_records(60)
    prompts = load_suite_file(suite, _write_jsonl(tmp_path / "HumanEval.jsonl", records))
    assert len(prompts) == data.LONG_PROMPTS and len({p.id for p in prompts}) == len(prompts)
    kinds = list(data.LONG_EDIT_INSTRUCTIONS if suite == "longedit" else data.LONG_QUESTIONS)
    assert [p.meta["kind"] for p in prompts] == [kinds[i % 3] for i in range(len(prompts))]
    for p in prompts:
        name = p.meta["entry_point"]
        assert p.suite == suite and p.messages == [{"role": "user", "content": p.text}]
        assert p.text.count(f"def {name}(") == 1 and f"`{name}`" in p.text
        assert p.meta["module_chars"] >= data.LONG_MIN_CHARS
        # the module holds consecutive tasks and the asked-about one sits inside it
        assert p.text.startswith("Here is a Python module:\n\n```python\n")
        assert p.text.index(f"def {name}(") < p.text.index("```\n\n")
    # windows holding both tasks named shared_name exist, and ask about another function
    assert any(p.text.count("def shared_name(") == 2 for p in prompts)
    # the same input gives the same prompts (no randomness, no machine-dependent source)
    again = load_suite_file(suite, _write_jsonl(tmp_path / "again.jsonl", records))
    assert [p.text for p in again] == [p.text for p in prompts]


def test_long_suite_windows_wrap_and_stop_at_all_tasks(tmp_path: Path) -> None:
    # 4 short tasks never reach LONG_MIN_CHARS: each window takes all of them, once.
    prompts = load_suite_file("longqa", _write_jsonl(tmp_path / "h.jsonl", HUMANEVAL))
    assert len(prompts) == len(HUMANEVAL)
    for p in prompts:
        assert all(p.text.count(f"def f{i}(") == 1 for i in range(len(HUMANEVAL)))


def test_long_text_suite_keeps_long_prose_first_turns(tmp_path: Path) -> None:
    prose = ("The committee met on Tuesday to discuss the budget and the new hiring plan. " * 60).strip()
    code = "def f(x):\n    return {x: x}; y = x < 2\n" * 80
    table = "| a | b | c |\n" * 300
    conversations = [
        {"id": "short", "conversations": [{"from": "human", "value": "Summarise: " + prose[:500]}]},
        {"id": "code", "conversations": [{"from": "human", "value": code}]},
        {"id": "table", "conversations": [{"from": "human", "value": table}]},
        {"id": "reply_first", "conversations": [{"from": "gpt", "value": prose}]},
        {"id": "too_long", "conversations": [{"from": "human", "value": prose * 4}]},
    ] + [{"id": f"text{i}", "conversations": [{"from": "human", "value": f"Text {i}: {prose}\nSummarise it."},
                                             {"from": "gpt", "value": f"Summary {i}."}]}
         for i in range(data.LONG_PROMPTS + 5)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    prompts = load_suite_file("longtext", path)
    assert [p.id for p in prompts] == [f"longtext/text{i}" for i in range(data.LONG_PROMPTS)]
    for i, p in enumerate(prompts):
        assert p.suite == "longtext" and p.messages == [{"role": "user", "content": p.text}]
        assert data.LONG_TEXT_CHARS[0] <= len(p.text) <= data.LONG_TEXT_CHARS[1]
        assert p.meta["answer"] == f"Summary {i}."


@pytest.mark.model
def test_real_long_suites_fit_the_context(tmp_path: Path) -> None:
    """>= 20 prompts of >= 1,500 Qwen tokens (chat template applied; longtext: 40 of >= 600), all
    fitting n_ctx 4096 with 192 new tokens and the 64 tokens llama-speculative-simple may draft past
    them."""
    from pyspec import Engine

    with Engine("qwen2.5-coder-1.5b-instruct", n_ctx=512, n_threads=2) as engine:
        for suite in ("longedit", "longqa"):
            prompts = load_suite(suite)
            lengths = [len(engine.prompt_tokens(p.messages)) for p in prompts]
            assert len(prompts) >= 20, suite
            assert min(lengths) >= 1500 and max(lengths) + 192 + 64 <= 4096, (suite, min(lengths), max(lengths))
        prompts = load_suite("longtext")
        lengths = [len(engine.prompt_tokens(p.messages)) for p in prompts]
        assert len(prompts) == data.LONG_PROMPTS
        assert min(lengths) >= 600 and max(lengths) + 192 + 64 <= 4096, ("longtext", min(lengths), max(lengths))
