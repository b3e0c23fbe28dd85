"""Running llama.cpp's `llama-completion` and `llama-speculative-simple` on one prompt, and reading
what they report (tool location and building: `pyspec.bench.llamacpp`).

Both tools get the prompt text as a binary file (`-bf`: no escape processing with --no-escape, no
trailing newline dropped, as `-f` would) and tokenize it as the engine does (special tokens
parsed, the model's own BOS rule). What each tool's speed figure covers, read from its source at
commit 0c1e570:

- llama-completion, `eval time = T ms / N runs (..., X tokens per second)`: the time inside
  llama_decode (until the logits are synchronized) of the one-token decodes, prompt excluded;
  sampling, detokenizing and printing are outside it. N is generated tokens - 1 when the length
  limit ends the run (the last sampled token is never decoded). Its `total time` line (from
  after model load and warm-up to the end) is the wall time of prompt processing + generation.
- llama-speculative-simple, `decoded N tokens in T seconds, speed: X t/s`: the wall time of the
  whole speculative loop (drafting, the target's verification decodes, sampling, printing),
  which starts with the last prompt token (the rest of the prompt, and the draft model's prompt
  processing, are in its `encoded` line). N counts every token the loop accepted, the end token
  included. With `-n N` it stops once more than N tokens were generated, and its last step drafts
  without a length limit (a draft limit of 0 means "none" to its drafters), so it can run past N
  by up to one draft (48-64 tokens in the n-gram modes) at the cost of one large batch; its
  figures count those tokens. It therefore runs with debug logging (`-lv 5`), whose per-step
  line `accepted A/D draft tokens` carries the tool's own timestamp: `ToolRun.
  decode_tokens_per_second_within_limit` is the rate up to the last step that stayed within the
  limit, as if the run had stopped there.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .llamacpp import LlamaCppToolsError

log = logging.getLogger(__name__)

COMPLETION = "llama-completion"
SPECULATIVE = "llama-speculative-simple"
END_OF_TEXT = b" [end of text]\n"
STDERR_TAIL_LINES = 20
ATTEMPTS = 15  # the tools' asynchronous log loses its last lines at exit now and then, in bursts (5 in a row seen)
_NUMBER = r"(\d+(?:\.\d+)?|inf|nan)"


@dataclass(frozen=True)
class ToolSettings:
    """What every tool run shares with the engine it is compared with."""

    model: str  # target GGUF
    n_ctx: int
    n_threads: int
    repack: bool  # llama.cpp's weight repacking (extra buffer types); --no-repack when False
    # -fa: the engine's setting (a bool), or "auto" (llama.cpp's own choice, its default) where the
    # engine decided its own by measurement
    flash_attn: bool | str = False
    n_ubatch: int = 512  # the engine's batch size: prompts are evaluated in chunks of this many tokens
    n_gpu_layers: int = 0
    # Transparent huge pages for the tools' allocations, as the engine asks for its own (README,
    # Notes): glibc's malloc advises them when GLIBC_TUNABLES holds glibc.malloc.hugetlb=1.
    huge_pages: bool = True
    # 0: greedy; above 0: plain temperature sampling (top-k, top-p and min-p off, as the engine's
    # defaults), from the seed when one is given (else the tool's own random seed)
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class ToolRun:
    """One generation by a llama.cpp tool, as the tool reported it."""

    text: str  # generated text, bytes the tool printed decoded with surrogateescape (lossless)
    special_rendered: bool  # whether special tokens were printed as text (speculative-simple) or as ""
    n_prompt_tokens: int  # the tool's count of the prompt's tokens
    n_generated: int  # llama-completion: generated tokens; speculative-simple: its own `decoded` count
    finish_reason: str  # "stop" (end token) | "length"
    decode_s: float
    decode_tokens_per_second: float  # the tool's own decode figure (module docstring)
    # speculative-simple: tokens / loop time up to its last step within max_tokens (module
    # docstring); llama-completion: its decode figure (it never passes the limit)
    decode_tokens_per_second_within_limit: float | None
    wall_s: float  # prompt processing + generation as the tool timed it (model load excluded)
    process_s: float = 0.0  # the whole process, model load and warm-up included
    n_drafted: int | None = None  # speculative-simple only
    n_accepted: int | None = None

    @property
    def text_bytes(self) -> bytes:
        return self.text.encode("utf-8", "surrogateescape")


def _sampling_args(settings: ToolSettings) -> list[str]:
    if settings.temperature <= 0:
        return ["--temp", "0"]
    # the tools' other samplers (penalties, DRY, typical, XTC) are off by default
    args = ["--temp", f"{settings.temperature:g}", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
    return args if settings.seed is None else [*args, "--seed", str(settings.seed)]


def _common_args(settings: ToolSettings, prompt_file: Path) -> list[str]:
    args = [
        "-m", settings.model, "-bf", str(prompt_file), "--no-escape", *_sampling_args(settings),
        "-t", str(settings.n_threads), "-tb", str(settings.n_threads), "-c", str(settings.n_ctx),
        # speculative-simple needs the whole prompt in one logical batch; the physical batch is the engine's
        "-b", str(max(settings.n_ctx, settings.n_ubatch)), "-ub", str(settings.n_ubatch),
        "-fa", settings.flash_attn if isinstance(settings.flash_attn, str) else ("on" if settings.flash_attn else "off"), "-ngl", str(settings.n_gpu_layers),
        "-co", "off", "--log-colors", "off", "--log-prefix", "--log-timestamps",
        "-fit", "off",  # its automatic fitting to device memory only adjusts what is not set here
    ]  # fmt: skip
    if not settings.repack:
        args.append("--no-repack")
    return args


def completion_args(settings: ToolSettings, prompt_file: Path, max_tokens: int) -> list[str]:
    return [*_common_args(settings, prompt_file), "-n", str(max_tokens), "-no-cnv", "--no-display-prompt", "-lv", "3"]


def speculative_args(settings: ToolSettings, prompt_file: Path, max_tokens: int, spec_type: str,
                     draft: str | None = None, n_draft: int | None = None) -> list[str]:
    # -n N generates at least N + 1 tokens (module docstring): ask for max_tokens - 1.
    args = [*_common_args(settings, prompt_file), "-n", str(max(max_tokens - 1, 0)), "--spec-type", spec_type,
            "-lv", "5"]  # debug: per-step lines with timestamps (module docstring)
    if draft is not None:
        args += ["-md", draft, "-ngld", str(settings.n_gpu_layers)]
    if n_draft is not None:
        args += ["--spec-draft-n-max", str(n_draft)]
    return args


class IncompleteOutput(LlamaCppToolsError):
    """A tool's last log lines are missing. Its logger writes from a thread of its own that the
    process does not wait for at exit, so the end of a run's output is sometimes lost; running
    again helps."""


def _search(pattern: str, text: str, tool: str, what: str) -> re.Match[str]:
    match = re.search(pattern, text)
    if match is None:
        raise IncompleteOutput(f"{tool}: no {what} line in its output (expected /{pattern}/)")
    return match


def parse_completion(stdout: bytes, stderr: str, max_tokens: int) -> ToolRun:
    """Reads a `llama-completion -no-cnv --no-display-prompt` run: generated text on stdout, then
    " [end of text]" if an end token stopped it, then a blank line; timings on stderr, last.
    The tool logs through one queue, in order: once its timing lines are there, so is the text."""
    prompt = _search(rf"prompt eval time =\s*{_NUMBER} ms /\s*(\d+) tokens", stderr, COMPLETION, "prompt eval time")
    decode = _search(rf"\beval time =\s*{_NUMBER} ms /\s*(\d+) runs\s*\(\s*{_NUMBER} ms per token,\s*{_NUMBER} "
                     r"tokens per second\)", stderr, COMPLETION, "eval time")
    total = _search(rf"total time =\s*{_NUMBER} ms", stderr, COMPLETION, "total time")
    if not stdout.endswith(b"\n\n"):  # lost at exit as the log lines can be: run again
        raise IncompleteOutput(f"{COMPLETION}: its output does not end with the blank line it prints after the "
                               f"text (it ends with {stdout[-40:]!r})")
    body = stdout[:-2]
    stopped = body.endswith(END_OF_TEXT)
    if stopped:
        body = body[: -len(END_OF_TEXT)]
    n_runs = int(decode.group(2))
    # An end token is sampled after the last decode; the length limit leaves the last token undecoded.
    n_generated = n_runs if stopped else max_tokens
    return ToolRun(
        text=body.decode("utf-8", "surrogateescape"), special_rendered=False, n_prompt_tokens=int(prompt.group(2)),
        n_generated=n_generated, finish_reason="stop" if stopped else "length",
        decode_s=float(decode.group(1)) / 1e3, decode_tokens_per_second=float(decode.group(4)),
        decode_tokens_per_second_within_limit=float(decode.group(4)), wall_s=float(total.group(1)) / 1e3,
    )


def parse_speculative(stdout: bytes, stderr: str, prompt: bytes, max_tokens: int) -> ToolRun:
    """Reads a `llama-speculative-simple` run: a blank line, the prompt, the generated text and a
    blank line on stdout, then its counts and timings on stderr, then one more blank line on
    stdout. That last one is the line most likely lost at exit (IncompleteOutput): when it is
    missing and the text itself ends in a blank line, the text reads one blank line short."""
    encoded = _search(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds", stderr, SPECULATIVE, "encoded")
    decoded = _search(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds, speed:\s+{_NUMBER} t/s", stderr,
                      SPECULATIVE, "decoded")
    drafted = _search(r"n_drafted\s*=\s*(\d+)", stderr, SPECULATIVE, "n_drafted")
    accepted = _search(r"n_accept\s*=\s*(\d+)", stderr, SPECULATIVE, "n_accept")
    head = b"\n\n" + prompt
    if not stdout.startswith(head):
        if stdout.lstrip(b"\n").startswith(prompt.lstrip(b"\n")):
            # the echo is right but its blank lines are not where they belong: the logger's queue
            # has been seen to put an extra one ahead of the prompt (4 newlines) at exit; run again
            raise IncompleteOutput(f"{SPECULATIVE}: its output has the prompt it was given, but not after "
                                   f"exactly one blank line (it starts with {stdout[:12]!r})")
        raise LlamaCppToolsError(f"{SPECULATIVE}: its output is not blank line + prompt + text + blank line (the "
                                 "prompt it echoed differs from the one given?)")
    if not stdout.endswith(b"\n\n"):  # both blank lines lost at exit, or more: run again
        raise IncompleteOutput(f"{SPECULATIVE}: its output does not end with the blank line after the text "
                               f"(it ends with {stdout[-40:]!r})")
    body = stdout[len(head):]
    body = body[:-4] if body.endswith(b"\n\n\n\n") else body[:-2]
    n_generated = int(decoded.group(1))
    decode_s = float(decoded.group(2))
    return ToolRun(
        text=body.decode("utf-8", "surrogateescape"), special_rendered=True, n_prompt_tokens=int(encoded.group(1)),
        n_generated=n_generated, finish_reason="length" if n_generated >= max_tokens else "stop",
        decode_s=decode_s, decode_tokens_per_second=float(decoded.group(3)),
        decode_tokens_per_second_within_limit=_rate_within_limit(stderr, n_generated, decode_s, max_tokens),
        wall_s=float(encoded.group(2)) + float(decoded.group(2)),
        n_drafted=int(drafted.group(1)), n_accepted=int(accepted.group(1)),
    )


_TIMESTAMP = r"^(\d+)\.(\d+)\.(\d+)\.(\d+) "  # the log prefix: minutes.seconds.milliseconds.microseconds


def _log_time_s(match: re.Match[str]) -> float:
    minutes, seconds, ms, us = (int(g) for g in match.groups()[:4])
    return minutes * 60.0 + seconds + ms / 1e3 + us / 1e6


def _rate_within_limit(stderr: str, n_generated: int, decode_s: float, max_tokens: int) -> float | None:
    """Tokens / seconds of llama-speculative-simple's loop up to its last step that ended within
    max_tokens, from its debug lines; None without them, or when they do not add up to the
    tool's own count (then they do not describe every step)."""
    steps = [(_log_time_s(m), int(m.group(5)) + 1) for m in re.finditer(
        _TIMESTAMP + r"D accepted (\d+)/\d+ draft tokens", stderr, re.MULTILINE)]
    decoded = re.search(_TIMESTAMP + r"I decoded ", stderr, re.MULTILINE)
    if not steps or decoded is None or sum(n for _, n in steps) != n_generated:
        return None
    start = _log_time_s(decoded) - decode_s  # the loop ended just before this line was logged
    n_tokens, end = 0, start
    for t, n in steps:
        if n_tokens + n > max_tokens:
            break
        n_tokens, end = n_tokens + n, t
    return n_tokens / (end - start) if n_tokens and end > start else None


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def tool_env(settings: ToolSettings) -> dict[str, str]:
    """The environment without LLAMA_* variables: the tools read settings from them (LLAMA_ARG_*,
    LLAMA_LOG_*) and only the command line should decide. With settings.huge_pages, glibc's
    tunable that makes malloc ask for transparent huge pages (one-token decoding 18.3 tok/s
    against 17.0 without, llama-bench tg48 on the Intel development machine, THP in madvise mode)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    if settings.huge_pages:
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")]
        env["GLIBC_TUNABLES"] = ":".join([*tunables, HUGE_PAGES_TUNABLE])
    return env


def _execute(tool: Path, args: list[str], env: dict[str, str], parse: Callable[[bytes, str], ToolRun],
             timeout_s: float | None) -> ToolRun:
    """Runs the tool and parses its output; runs it again (up to ATTEMPTS times in all) when the
    end of its output was lost at exit."""
    for attempt in range(1, ATTEMPTS + 1):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([str(tool), *args], capture_output=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise LlamaCppToolsError(f"{tool.name} did not finish within {timeout_s:.0f} s") from None
        elapsed = time.perf_counter() - t0
        stderr = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            tail = "\n".join(stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
            raise LlamaCppToolsError(f"{tool.name} failed (exit {proc.returncode}): {shlex.join(args)}\n{tail}")
        try:
            return replace(parse(proc.stdout, stderr), process_s=elapsed)
        except IncompleteOutput as e:
            if attempt == ATTEMPTS:
                raise
            log.warning("%s; running %s again", e, tool.name)
    raise AssertionError("unreachable")


def run_completion(bin_dir: Path, settings: ToolSettings, prompt_file: Path, max_tokens: int,
                   timeout_s: float | None = None) -> ToolRun:
    """Plain generation (greedy, or sampled as settings say) of at most max_tokens tokens after the
    prompt in prompt_file."""
    return _execute(bin_dir / COMPLETION, completion_args(settings, prompt_file, max_tokens), tool_env(settings),
                    lambda out, err: parse_completion(out, err, max_tokens), timeout_s)


def run_speculative(bin_dir: Path, settings: ToolSettings, prompt_file: Path, max_tokens: int, spec_type: str,
                    draft: str | None = None, n_draft: int | None = None,
                    timeout_s: float | None = None) -> ToolRun:
    """Speculative generation (`--spec-type spec_type`; greedy, or sampled as settings say) of at
    least max_tokens tokens."""
    prompt = Path(prompt_file).read_bytes()
    return _execute(bin_dir / SPECULATIVE, speculative_args(settings, prompt_file, max_tokens, spec_type, draft, n_draft),
                    tool_env(settings), lambda out, err: parse_speculative(out, err, prompt, max_tokens), timeout_s)


def write_prompt(path: str | os.PathLike[str], text: str) -> Path:
    """The prompt file the tools read with -bf: the text's UTF-8 bytes, nothing added or dropped."""
    path = Path(path)
    path.write_bytes(text.encode("utf-8"))
    return path
