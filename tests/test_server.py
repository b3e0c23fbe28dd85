"""`pyspec serve` tested as a user would: a real server process on 127.0.0.1, the official
`openai` client (and raw httpx where the client would hide what is sent), tiny models."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from server_process import ServerProcess

import pyspec

N_CTX = 2048
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def server(tiny_target: str, tiny_drafts: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = ServerProcess("--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--model-name", "tiny",
                         "--n-ctx", str(N_CTX), "--threads", "2", "--method", "chain", log_path=log)
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_target: str, tiny_drafts: dict[str, str]):
    """The same models in this process: what the server must return."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=N_CTX, n_threads=2) as engine:
        yield engine


MESSAGES = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Write a function that adds two numbers."}]


def test_models_and_health(server: ServerProcess, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    health = httpx.get(server.base_url + "/health").json()
    assert health["status"] == "ok" and health["draft_version"] == 1


@pytest.mark.parametrize("method", ["none", "chain", "tree", "lookup"])
def test_chat_equals_the_engine(client: openai.OpenAI, reference: pyspec.Engine, method: str) -> None:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, extra_body={"method": method},
                                       **GREEDY)
    expected = reference.generate(MESSAGES, max_tokens=24, method="none")
    choice = r.choices[0]
    assert choice.message.content == expected.text
    assert choice.message.role == "assistant"
    assert choice.finish_reason == expected.finish_reason
    assert r.usage.prompt_tokens == len(expected.prompt_tokens)
    assert r.usage.completion_tokens == len(expected.tokens)
    assert r.model_extra["pyspec"]["method"] == method


def test_chat_stream_joins_to_the_same_text(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=32, **GREEDY)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=32, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_completion_text_tokens_and_stream(client: openai.OpenAI, reference: pyspec.Engine) -> None:
    prompt = "def fibonacci(n):\n"
    expected = reference.generate(prompt, max_tokens=20, method="none")
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, **GREEDY)
    assert r.object == "text_completion" and r.choices[0].text == expected.text
    by_tokens = client.completions.create(model="tiny", prompt=reference.tokenize(prompt), max_tokens=20, **GREEDY)
    assert by_tokens.choices[0].text == expected.text
    streamed = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_stop_and_seed(client: openai.OpenAI) -> None:
    free = client.completions.create(model="tiny", prompt="x = 1\n", max_tokens=40, **GREEDY).choices[0].text
    stop = free[5:8]
    assert stop
    cut = client.completions.create(model="tiny", prompt="x = 1\n", max_tokens=40, stop=[stop], **GREEDY)
    assert cut.choices[0].text == free[:free.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="tiny", prompt="x = 1\n", max_tokens=24, temperature=0.9, top_p=0.9,
                                         seed=11).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_chat_logprobs(client: openai.OpenAI, reference: pyspec.Engine) -> None:
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, logprobs=True, top_logprobs=3,
                                       **GREEDY)
    expected = reference.generate(MESSAGES, max_tokens=16, method="none", logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 16
    for i, entry in enumerate(content):
        assert bytes(entry.bytes) == reference.token_bytes(expected.tokens[i])
        assert entry.logprob == pytest.approx(float(expected.logprobs.token_logprobs[i]), abs=2e-3)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].bytes == entry.bytes  # greedy: the chosen token is the likeliest
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    streamed = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, logprobs=True,
                                              top_logprobs=3, stream=True, **GREEDY)
    joined = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.bytes for e in joined] == [e.bytes for e in content]
    assert [e.logprob for e in joined] == pytest.approx([e.logprob for e in content], abs=1e-6)


def test_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="import os\n", max_tokens=10, logprobs=2, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert all(len(top) <= 2 for top in lp.top_logprobs) and all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset[0] == 0


def test_content_parts_and_prefix_cache(client: openai.OpenAI) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Sort a list."},
                                          {"type": "text", "text": "Use Python."}]}]
    joined = [{"role": "user", "content": "Sort a list.\nUse Python."}]
    a = client.chat.completions.create(model="tiny", messages=parts, max_tokens=12, **GREEDY)
    b = client.chat.completions.create(model="tiny", messages=joined, max_tokens=12, **GREEDY)
    assert a.choices[0].message.content == b.choices[0].message.content
    # The same conversation again, one turn longer: the earlier turns come from the KV cache.
    follow = joined + [{"role": "assistant", "content": b.choices[0].message.content},
                       {"role": "user", "content": "Now in reverse order."}]
    c = client.chat.completions.create(model="tiny", messages=follow, max_tokens=12, **GREEDY)
    assert c.usage.prompt_tokens_details.cached_tokens >= b.usage.prompt_tokens - 1


def test_errors_are_openai_error_objects(server: ServerProcess, client: openai.OpenAI) -> None:
    for bad in ({"temperature": 3.0}, {"top_p": 0.0}, {"n": 2}, {"max_tokens": 0}, {"top_logprobs": 3},
                {"extra_body": {"method": "bogus"}}, {"extra_body": {"n_draft": 0, "method": "chain"}},
                {"presence_penalty": 2.5}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MESSAGES, **{"max_tokens": 4, **bad})
        assert e.value.body["type"] == "invalid_request_error", bad
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="word " * (N_CTX + 10), max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    # A streamed request with bad settings fails with its status, before any event is sent.
    with pytest.raises(openai.BadRequestError):
        list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True,
                                            extra_body={"method": "bogus"}))
    raw = httpx.post(server.base_url + "/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                     headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and "malformed JSON" in raw.json()["error"]["message"]
    missing = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "tiny"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    assert httpx.get(server.base_url + "/v1/nothing").json()["error"]["type"] == "not_found_error"
    # The server still serves.
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=2).choices[0].text is not None


def _long_request() -> dict:
    return dict(model="tiny", messages=[{"role": "user", "content": "Count forever."}], max_tokens=N_CTX - 64,
                extra_body={"method": "none"}, **GREEDY)


def _tokens_after_cancel(server: ServerProcess, before_cancelled: float, before_tokens: float) -> float:
    """Waits until the server counted one more cancelled chat request and its queue is empty;
    returns the tokens generated since before_tokens."""
    deadline = time.monotonic() + 30
    while server.metric("pyspec_requests_total", '{endpoint="chat",outcome="cancelled"}') == before_cancelled:
        assert time.monotonic() < deadline, "the disconnect was not noticed"
        time.sleep(0.05)
    while server.metric("pyspec_queue_depth") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return server.metric("pyspec_generated_tokens_total") - before_tokens


def test_stream_disconnect_cancels_the_generation(server: ServerProcess, client: openai.OpenAI) -> None:
    before_cancelled = server.metric("pyspec_requests_total", '{endpoint="chat",outcome="cancelled"}')
    before_tokens = server.metric("pyspec_generated_tokens_total")
    stream = client.chat.completions.create(stream=True, **_long_request())
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()  # the client disconnects
    generated = _tokens_after_cancel(server, before_cancelled, before_tokens)
    assert generated < (N_CTX - 64) / 2, f"the generation went on for {generated} tokens after the disconnect"


def test_non_stream_disconnect_cancels_the_generation(server: ServerProcess) -> None:
    body = _long_request()
    body.update(body.pop("extra_body"))
    # The same request left to finish reaches its end (no end-of-text comes first); how long that
    # takes depends on the machine's load (the tiny models make thousands of tokens a second), so
    # the client below leaves after a tenth of that time rather than after a fixed delay. The
    # faster of two runs: a first run slowed by a burst of load (or a one-time cost) gave a time
    # the cancelled request finished within (once, with two test suites on 2 cores).
    t_full = float("inf")
    for _ in range(2):
        t0 = time.monotonic()
        full = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
        t_full = min(t_full, time.monotonic() - t0)
        assert full["usage"]["completion_tokens"] == N_CTX - 64
    before_cancelled = server.metric("pyspec_requests_total", '{endpoint="chat",outcome="cancelled"}')
    before_tokens = server.metric("pyspec_generated_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(10, read=t_full / 10))
    generated = _tokens_after_cancel(server, before_cancelled, before_tokens)
    # What must hold: the generation stopped before the end the same request reaches.
    assert generated < N_CTX - 64, f"the generation went on to its end ({generated} tokens) after the disconnect"


def test_concurrent_clients_and_health_during_generation(server: ServerProcess, client: openai.OpenAI,
                                                         reference: pyspec.Engine) -> None:
    prompts = [f"def task_{i}(x):\n" for i in range(4)]
    expected = [reference.generate(p, max_tokens=24, method="none").text for p in prompts]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            r = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=24, **GREEDY)
            results[i] = r.choices[0].text
        except BaseException as exc:  # reported below
            errors.append(exc)

    long = threading.Thread(target=lambda: client.chat.completions.create(**_long_request()))
    long.start()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # /health answers while the generations run and wait (not after them): it reports the
    # waiting requests before the long one has finished.
    health, answered_while_busy = None, False
    while long.is_alive():
        reply = httpx.get(server.base_url + "/health", timeout=30).json()
        if reply["queue_depth"] >= 1:
            health, answered_while_busy = reply, long.is_alive()
            break
        time.sleep(0.01)
    for t in threads + [long]:
        t.join(120)
    assert not errors, errors
    assert [results[i] for i in range(4)] == expected
    assert health is not None and answered_while_busy, "no /health reply saw a waiting request during the generation"


def test_metrics(server: ServerProcess, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, **GREEDY)
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("pyspec_requests_total", "pyspec_generated_tokens_total", "pyspec_acceptance_rate",
                 "pyspec_tokens_per_target_call", "pyspec_draft_version", "pyspec_queue_depth",
                 "pyspec_prefix_cache_hits_total", "pyspec_prompt_tokens_cached_total"):
        assert f"# TYPE {name} " in text, name
    assert server.metric("pyspec_requests_total", '{endpoint="chat",outcome="ok"}') >= 1
    assert server.metric("pyspec_prefix_cache_hits_total") >= 1
    assert server.metric("pyspec_draft_version", '{slot=""}') == 1
    assert server.metric("pyspec_pool_capacity") == 65536
    assert server.metric("pyspec_pool_bytes") > 0


def test_restart_keeps_the_pool_and_a_bad_pool_file_is_set_aside(tiny_target: str, tmp_path: Path) -> None:
    pool_file = tmp_path / "pool.bin"
    first = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "512", "--threads", "1",
                          "--pool-file", str(pool_file), log_path=tmp_path / "first.log")
    try:
        c = openai.OpenAI(base_url=first.base_url + "/v1", api_key="unused", max_retries=0)
        for i in range(3):
            c.completions.create(model="tiny", prompt=f"for item in range({i}):\n    print(item)\n", max_tokens=16,
                                 extra_body={"method": "lookup"}, **GREEDY)
        phrases = first.metric("pyspec_pool_phrases")
        assert phrases > 0
    finally:
        assert first.stop() == 0, first.log()
    assert pool_file.exists()
    second = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "512", "--threads", "1",
                           "--pool-file", str(pool_file), log_path=tmp_path / "second.log")
    try:
        assert second.metric("pyspec_pool_phrases") == phrases
    finally:
        assert second.stop() == 0, second.log()
    pool_file.write_bytes(b"not a pool file at all")
    third = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "512", "--threads", "1",
                          "--pool-file", str(pool_file), "--pool-capacity", "3", log_path=tmp_path / "third.log")
    try:
        assert third.metric("pyspec_pool_file_errors_total") == 1
        assert third.metric("pyspec_pool_phrases") == 0
        aside = list(tmp_path.glob("pool.bin.unreadable-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == b"not a pool file at all"
        c = openai.OpenAI(base_url=third.base_url + "/v1", api_key="unused", max_retries=0)
        c.completions.create(model="tiny", prompt="while True:\n    pass\n", max_tokens=8,
                             extra_body={"method": "lookup"}, **GREEDY)
        assert third.metric("pyspec_pool_capacity") == 3
        assert 0 < third.metric("pyspec_pool_phrases") <= 3
    finally:
        assert third.stop() == 0, third.log()
    assert "cannot be used" in third.log()
    assert pool_file.read_bytes() != b"not a pool file at all"  # a valid pool was saved over it


def test_restart_keeps_auto_statistics_and_a_bad_file_is_set_aside(tiny_target: str, tmp_path: Path) -> None:
    """--stats-file: saved while the server runs (every --stats-save-interval seconds once
    requests ran: a crash loses at most that much) and at shutdown, loaded at start, an unusable
    file moved aside."""
    stats_file = tmp_path / "stats.json"
    args = ("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "512", "--threads", "1",
            "--stats-file", str(stats_file), "--stats-save-interval", "0.2")
    first = ServerProcess(*args, log_path=tmp_path / "first.log")
    try:
        c = openai.OpenAI(base_url=first.base_url + "/v1", api_key="unused", max_retries=0)
        for i in range(3):
            c.completions.create(model="tiny", prompt=f"for item in range({i}):\n    print(item)\n", max_tokens=16,
                                 extra_body={"method": "auto"}, **GREEDY)
        def counts_saved() -> bool:  # a save after a request that taught auto something
            if first.metric("pyspec_stats_saves_total") < 1:
                return False
            running = json.loads(stats_file.read_text(encoding="utf-8"))  # written before any shutdown
            return any(sum(v) > 0 for v in running["stats"].values())

        deadline = time.monotonic() + 30
        while not counts_saved() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts_saved(), first.log()
        # The save of the last request's counts may still be due (later on a busy machine): wait
        # until the count holds still for six save intervals, then no request means no save.
        saves, still_since = first.metric("pyspec_stats_saves_total"), time.monotonic()
        settle_deadline = still_since + 30  # its own: the wait above may have used most of its 30 s
        while time.monotonic() - still_since < 1.2:
            assert time.monotonic() < settle_deadline, f"saves never held still ({saves} so far)\n{first.log()}"
            time.sleep(0.1)
            now = first.metric("pyspec_stats_saves_total")
            if now != saves:
                saves, still_since = now, time.monotonic()
        time.sleep(1.0)
        assert first.metric("pyspec_stats_saves_total") == saves, first.log()
    finally:
        assert first.stop() == 0, first.log()
    saved = json.loads(stats_file.read_text(encoding="utf-8"))
    assert saved["stats"] and any(sum(v) > 0 for v in saved["stats"].values())
    second = ServerProcess(*args, log_path=tmp_path / "second.log")
    assert second.stop() == 0, second.log()
    assert "loaded auto's acceptance statistics" in second.log()
    assert json.loads(stats_file.read_text(encoding="utf-8"))["stats"] == saved["stats"]  # kept as loaded
    stats_file.write_text("{not statistics", encoding="utf-8")
    third = ServerProcess(*args, log_path=tmp_path / "third.log")
    assert third.stop() == 0, third.log()
    assert "cannot be used" in third.log()
    aside = list(tmp_path.glob("stats.json.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_text(encoding="utf-8") == "{not statistics"
    assert json.loads(stats_file.read_text(encoding="utf-8"))["format"] == 1  # a valid file saved over it


def tie_free_prompt(engine: pyspec.Engine, candidates: list[str], n_tokens: int, min_gap: float = 0.01) -> str:
    """The first candidate whose greedy continuation keeps a top-2 logit gap >= min_gap everywhere
    (batched and one-token logits of the tiny f32 models differ by < 1e-3: spec/model.h)."""
    for prompt in candidates:
        r = engine.generate(prompt, max_tokens=n_tokens, method="none")
        rows = engine.evaluate(r.prompt_tokens + r.tokens, all_rows=True)[len(r.prompt_tokens) - 1:]
        top2 = np.sort(rows, axis=1)[:, -2:]
        if float((top2[:, 1] - top2[:, 0]).min()) >= min_gap:
            return prompt
    raise AssertionError("every candidate prompt has a near-tie on its greedy path")


def test_online_distils_and_reloads_the_draft(tiny_target: str, tiny_drafts: dict[str, str], tmp_path: Path,
                                              reference: pyspec.Engine) -> None:
    proc = ServerProcess("--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--model-name", "tiny",
                         "--n-ctx", "512", "--threads", "1", "--method", "chain", "--online", "--online-interval", "4",
                         "--online-work-dir", str(tmp_path / "drafts"), log_path=tmp_path / "online.log")
    try:
        c = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0)
        for i in range(12):
            r = c.completions.create(model="tiny", prompt=f"def f{i}(x):\n    return x * {i}\n", max_tokens=24,
                                     **GREEDY)
            assert r.choices[0].finish_reason in ("length", "stop")
        deadline = time.monotonic() + 120
        while proc.metric("pyspec_online_updates_total") < 1:
            assert time.monotonic() < deadline, proc.log()
            assert proc.metric("pyspec_online_failed_updates_total") == 0, proc.log()
            time.sleep(0.2)
        assert proc.metric("pyspec_draft_version", '{slot=""}') >= 2
        # Served by the reloaded draft, still exactly the target's output (on a prompt whose
        # greedy path has no near-tie: batched and one-token logits may flip those, docs/numerics.md).
        prompt = tie_free_prompt(reference, [f"def g{i}(x):\n    return x + {i}\n" for i in range(40)], 16)
        after = c.completions.create(model="tiny", prompt=prompt, max_tokens=16, **GREEDY)
        plain = c.completions.create(model="tiny", prompt=prompt, max_tokens=16, extra_body={"method": "none"},
                                     **GREEDY)
        assert after.choices[0].text == plain.choices[0].text
        assert after.model_extra["pyspec"]["draft_version"] >= 2
    finally:
        assert proc.stop() == 0, proc.log()


def test_json_body_of_a_chat_response(server: ServerProcess) -> None:
    """The raw body, as a non-Python client sees it."""
    r = httpx.post(server.base_url + "/v1/chat/completions",
                   json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert set(body["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert json.loads(json.dumps(body)) == body
