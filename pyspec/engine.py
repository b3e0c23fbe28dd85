"""The high-level API: an Engine holding a GGUF target (and optionally a draft) model."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Union

import numpy as np

from . import _core
from . import calibration
from .calibration import CostCurve, CostModelState
from .config import DEFAULT_N_DRAFT, METHODS, GenerationConfig, check_text
from .errors import EngineBusyError, EngineClosedError, InvalidArgumentError, SpecError
from .results import GenerationResult, GenerationStats, StreamChunk, TokenLogprobs, Trace

log = logging.getLogger("pyspec")
llama_log = logging.getLogger("pyspec.llama")

_LLAMA_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

__all__ = ["Engine", "TextStream", "METHODS", "DEFAULT_N_DRAFT", "GenerationConfig", "cpu_has_amx"]

Message = dict[str, Any]  # {"role": str, "content": str | None | list of content parts}
Prompt = Union[str, Sequence[int], Sequence[Message]]


def _forward_llama_logs() -> None:
    """Moves llama.cpp's buffered log lines into the `pyspec.llama` logger."""
    for line in _core.drain_logs():
        llama_log.log(_LLAMA_LEVELS.get(line.level, logging.DEBUG), "%s", line.text)


def cpu_has_amx() -> bool:
    """True when the CPU reports AMX tiles (Linux /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


REPACK_MODES = ("all", "weights", "off")


def repack_mode(repack: bool | str | None) -> str:
    """Engine(repack=...) as one of REPACK_MODES (see Engine): None picks "weights" on CPUs with
    AMX and "all" elsewhere; True is "all", False "off"."""
    if repack is None:
        return "weights" if cpu_has_amx() else "all"
    if isinstance(repack, bool):
        return "all" if repack else "off"
    if repack not in REPACK_MODES:
        raise InvalidArgumentError(f"repack must be None, True, False or one of {', '.join(REPACK_MODES)}; got {repack!r}")
    return repack


N_GPU_LAYERS_ENV = "PYSPEC_N_GPU_LAYERS"


def default_n_gpu_layers() -> int:
    """$PYSPEC_N_GPU_LAYERS as a whole number of layers to offload, 0 when unset or empty."""
    text = os.environ.get(N_GPU_LAYERS_ENV, "").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{N_GPU_LAYERS_ENV}={text!r} is not a whole number of layers "
                                   "(-1 offloads all of them)") from None


def rpc_servers(rpc: str | Sequence[str] | None) -> tuple[str, ...]:
    """Engine's rpc as a tuple of "host:port" endpoints: None or "" none, a string split at
    commas, or a sequence of strings. Raises InvalidArgumentError naming a malformed endpoint."""
    if rpc is None:
        return ()
    if isinstance(rpc, str):
        items = [part.strip() for part in rpc.split(",") if part.strip()]
    elif isinstance(rpc, Sequence) and all(isinstance(part, str) for part in rpc):
        items = [part.strip() for part in rpc]
    else:
        raise TypeError(f"rpc must be 'host:port[,host:port...]' or a sequence of such strings, got {rpc!r:.80}")
    for endpoint in items:
        _core.check_rpc_endpoint(endpoint)
    return tuple(items)


def rpc_supported() -> bool:
    """Whether the libllama in use has llama.cpp's RPC backend (Engine(rpc=...) needs it)."""
    return bool(_core.rpc_supported())


def message_text(content: Any, index: int) -> str:
    """The text of one chat message's content: a string, None (""), or a list of OpenAI content
    parts whose text parts are joined with newlines. Raises InvalidArgumentError for a non-text
    part and TypeError for anything else (including text that UTF-8 cannot encode)."""
    if content is None:
        return ""
    if isinstance(content, str):
        check_text(f"message {index} content", content)
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                check_text(f"message {index}, content part {j} text", part["text"])
                texts.append(part["text"])
            elif isinstance(kind, str) and kind != "text":
                raise InvalidArgumentError(f"message {index}, content part {j}: type {kind!r:.80} is not supported; "
                                           "this model reads text only (parts of type 'text')")
            else:
                raise TypeError(f"message {index}, content part {j} must be {{'type': 'text', 'text': str}}, "
                                f"got {part!r:.80}")
        return "\n".join(texts)
    raise TypeError(f"message {index}: content must be a string, None or a list of content parts, "
                    f"got {type(content).__name__}")


def _resolve(model: str | os.PathLike[str]) -> str:
    from .models import resolve_model  # local import: the registry is only needed for names

    return resolve_model(os.fspath(model))


class Engine:
    """Speculative decoding over a GGUF target model.

    target, draft: a GGUF path or a registry name (see `pyspec models list`); names are fetched
    on first use. The draft must share the target's vocabulary (checked at load time).
    drafts: more draft models by name ({"code": path, ...}), for per-request routing with
    generate(..., draft="code"); each is a draft slot like the default one (`draft`, slot "").
    head: a draft head GGUF trained for this target (`pyspec train-head`) for methods "redrafter"
    and "eagle", and for "auto" to weigh; reload_head() replaces it while serving. None (the
    default): the head `pyspec train-head` last wrote for this target file, if any
    (pyspec.head.known; one that fails to load is skipped with a warning); False: no head.
    n_threads: CPU threads for decoding (default: all cores). n_gpu_layers: layers offloaded when
    llama.cpp was built with a GPU backend (-1 or more than the model has: all); None = the
    environment's PYSPEC_N_GPU_LAYERS, else 0 (nothing offloaded). seed: seeds the engine's random stream; pass
    seed=... to generate() to make one call reproducible on its own. prefix_cache: keep each
    model's KV cache between requests and evaluate only the part of a new prompt after the
    longest token prefix it shares with what the cache holds (a chat resending its history pays
    only for the new turn); False clears the cache at every request. repack: llama.cpp's weight
    repacking for the CPU (ggml's extra CPU buffer types: faster decoding, one token and batched).
    "all" (or True): every extra buffer type llama.cpp offers; "weights": the matmul weights ggml
    repacks on x86 (Q4_0, Q4_K, IQ4_NL, ...) alone, without the AMX buffer type; "off" (or False):
    none. None = "all", except on CPUs with AMX, where ggml's AMX kernels crash with SIGILL on the
    machines we measured: "weights" there (one target token 62 ms instead of 79 with "off" on the
    Intel AMX development machine, docs/cost-curves.md). `repack_mode` says which is in use.
    huge_pages: ask the kernel for transparent huge pages on the buffers llama.cpp allocates for
    the models' weights and contexts (madvise; it matters where THP is in "madvise" mode: one
    target token 57 ms instead of 62 on that machine); False leaves the page size to the system.
    flash_attn: llama.cpp's flash attention for the models' contexts: "auto" (None: the default,
    or $PYSPEC_FLASH_ATTN) decides by measurement, "on" (True) / "off" (False) force it. "auto"
    times a plain step and an 8-token verification of the target both ways at two context depths
    once per model file, context window, threads, offload and build (cached beside the cost
    curves; the first engine pays ~1 s for the tiny test models, ~50 s for the 1.5B target on 2
    cores), extends each as a straight line to a typical request's 512 tokens of context (half the
    window if smaller), and turns it on where that is at least 2% cheaper there
    (docs/cost-curves.md, "Flash attention, decided by measurement").
    `flash_attn` says what is in use, `flash_attn_decision` what was measured. Its calibration is
    kept apart.
    rpc: llama.cpp rpc-servers ("host:port", a list or one comma-separated string) that hold the
    target's offloaded layers, split by their free memory; n_gpu_layers then defaults to all of
    them (-1). The draft model and head stay on this machine. Needs a libllama built with
    -DGGML_RPC=on (rpc_supported(); docs/install.md): ModelLoadError otherwise, and when a server
    does not answer.
    pool_capacity: phrases the engine's phrase pool keeps at most (least recently useful ones are
    evicted beyond it); None = the engine's default, 65,536 phrases, at most about 13 MB when full
    (pool_stats()["memory_bytes"] says what it takes now);
    InvalidArgumentError outside 1..16,777,216.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_gpu_layers: int | None = None,
        seed: int = 0,
        repack: bool | str | None = None,
        drafts: Mapping[str, str | os.PathLike[str]] | None = None,
        prefix_cache: bool = True,
        head: str | os.PathLike[str] | bool | None = None,
        pool_capacity: int | None = None,
        huge_pages: bool = True,
        ngram: str | os.PathLike[str] | None = None,
        flash_attn: bool | str | None = None,
        rpc: str | Sequence[str] | None = None,
    ) -> None:
        self.rpc = rpc_servers(rpc)
        self.target_path = _resolve(target)
        self.draft_path = _resolve(draft) if draft is not None else None
        threads = n_threads if n_threads is not None else (os.cpu_count() or 1)
        if n_gpu_layers is None:
            n_gpu_layers = -1 if self.rpc and not os.environ.get(N_GPU_LAYERS_ENV, "").strip() else default_n_gpu_layers()
        self.repack_mode = repack_mode(repack)
        if pool_capacity is not None and (isinstance(pool_capacity, bool) or not isinstance(pool_capacity, int)
                                          or pool_capacity < 1):
            raise InvalidArgumentError(f"pool_capacity must be a whole number of phrases >= 1, got {pool_capacity!r}")
        self.flash_attn_mode = calibration.flash_attn_mode(flash_attn)
        self.flash_attn_decision: calibration.FlashAttnDecision | None = None

        def load(fa: bool) -> Any:
            try:
                return _core.Engine(
                    self.target_path, self.draft_path or "", n_ctx, n_batch, threads, n_gpu_layers, 1,
                    self.repack_mode == "all", seed, reuse_prefix=bool(prefix_cache), pool_capacity=pool_capacity,
                    repack_weights=self.repack_mode == "weights", huge_pages=bool(huge_pages),
                    flash_attn=fa, rpc_servers=list(self.rpc),
                )
            finally:
                _forward_llama_logs()

        fa_on = self.flash_attn_mode == "on"
        fa_key = self._flash_attn_key = None
        self._flash_attn_measured = False
        if self.flash_attn_mode == "auto" and os.path.isfile(self.target_path):  # else the engine says what is wrong
            # as given: a setting the engine refuses is refused below, by the engine, as without "auto"
            fa_key = calibration.flash_attn_key(self.target_path, n_ctx=n_ctx, n_threads=threads,
                                                n_gpu_layers=n_gpu_layers, repack=self.repack_mode,
                                                huge_pages=bool(huge_pages), rpc=self.rpc)
            self._flash_attn_key = fa_key
            self.flash_attn_decision = calibration.load_flash_attn(fa_key)
            fa_on = bool(self.flash_attn_decision and self.flash_attn_decision.on)
        self._core: Any = load(fa_on)
        if fa_key is not None and self.flash_attn_decision is None:
            # Not decided on this machine for this file and window yet: time both settings once
            # (temporary contexts on the loaded weights), cache the choice, reload where it is "on".
            decision = None
            try:
                decision = calibration.measure_flash_attn(self._core, int(self._core.n_ctx))
            except SpecError as exc:  # e.g. no memory for the temporary contexts: run as without it
                log.warning("could not time flash attention (%s); it stays off", exc)
            except BaseException:
                self._core.close()
                raise
            finally:
                _forward_llama_logs()
            if decision is not None:
                try:
                    calibration.save_flash_attn(fa_key, decision)
                except OSError as exc:  # an unwritable cache costs the next engine the timing, nothing else
                    log.warning("could not cache the flash-attention choice: %s", exc)
                self.flash_attn_decision, self._flash_attn_measured = decision, True
            if decision is not None and decision.on:
                self._core.close()
                self._core = load(True)
                fa_on = True
        self.n_threads = threads
        self.n_gpu_layers = int(n_gpu_layers)
        self.huge_pages = bool(huge_pages)
        self.flash_attn = fa_on
        self._n_vocab = int(self._core.n_vocab)
        # One generation at a time: the engine owns one KV cache per model. A second caller
        # (another thread, or generate() while a stream() is running) waits its turn. Draft
        # swaps take the same lock, so a draft never changes during a generation.
        self._lock = threading.Lock()
        self._lock_holder: int | None = None  # the thread holding _lock, once it has it
        # Stream worker threads -> (the thread that opened the stream, its channel): a call from
        # that thread while the worker holds the engine and waits for it to read would hang.
        self._stream_workers: dict[int, tuple[int, "_StreamChannel"]] = {}
        self._draft_paths: dict[str, str] = {"": self.draft_path} if self.draft_path else {}
        try:
            for name, path in (drafts or {}).items():
                if not name:
                    raise ValueError("named drafts need a non-empty name; pass the default one as draft=")
                self.reload_draft(path, name=name)
            if head is None:
                self._load_known_head()
            elif head is not False:
                if head is True:
                    raise TypeError("head must be a path, None (the head known for the target) or False (none)")
                self.reload_head(head)
            if ngram is not None:
                self.load_ngram(ngram)
        except BaseException:
            self._core.close()
            raise

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds the engine (one generation, reload or evaluation at a time). Waits for the holder,
        except where the holder is a stream of this thread's that waits for this thread to read
        its chunks: EngineBusyError instead of a wait without end."""
        while not self._lock.acquire(timeout=0.05):
            worker = self._stream_workers.get(self._lock_holder or -1)
            if worker is not None and worker[0] == threading.get_ident() and worker[1].queue.full():
                raise EngineBusyError(
                    "this thread is reading a stream of this engine that waits for it to read on: finish "
                    "the stream (or close() it, or leave its loop) before calling the engine again")
        self._lock_holder = threading.get_ident()
        try:
            yield
        finally:
            self._lock_holder = None
            self._lock.release()

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Frees both models (after a running generation ends). Further calls raise EngineClosedError."""
        with self._locked():
            self._core.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return bool(self._core.closed)

    @property
    def repack(self) -> bool:
        """Whether any weight repacking is in use (repack_mode is not "off")."""
        return self.repack_mode != "off"

    def target_settings(self) -> dict[str, Any]:
        """The constructor arguments that set how the target runs (context, threads, GPU layers,
        repacking, huge pages, flash attention, RPC servers): Engine(engine.target_path,
        **engine.target_settings(), ...) runs the same target the same way, with whatever else the
        caller changes (bench's one-token evaluations take a batch of 1)."""
        return {"n_ctx": self.n_ctx, "n_threads": self.n_threads, "n_gpu_layers": self.n_gpu_layers,
                "repack": self.repack_mode, "huge_pages": self.huge_pages, "flash_attn": self.flash_attn,
                "rpc": self.rpc}

    @property
    def has_draft(self) -> bool:
        return bool(self._core.has_draft)

    @property
    def draft_version(self) -> int:
        """Models the default draft slot has held: 1 after loading one at construction, +1 per
        reload_draft; 0 when the engine has never had a default draft."""
        return int(self._core.draft_version(""))

    @property
    def draft_versions(self) -> dict[str, int]:
        """Version of every filled draft slot by name ("" is the default draft)."""
        return {name: int(self._core.draft_version(name)) for name in self._core.draft_names()}

    @property
    def draft_paths(self) -> dict[str, str]:
        """The GGUF each filled draft slot was loaded from."""
        names = set(self._core.draft_names())
        return {name: path for name, path in self._draft_paths.items() if name in names}

    # -- draft models: hot reload and routing slots ----------------------------------------------

    def reload_draft(self, path: str | os.PathLike[str], *, name: str = "") -> int:
        """Replaces the draft of slot `name` ("" = the default draft; another name adds or
        replaces a routing slot) by the GGUF at `path` (or a registry name); returns the slot's
        new version.

        The new model is loaded completely (same context settings as the constructor's draft)
        while generations continue, its vocabulary is checked against the target's, and only
        then is it swapped in, under the engine lock, i.e. between two generations. Any failure
        (FileNotFoundError, ModelLoadError for a corrupt or unloadable file, VocabMismatchError)
        leaves the old draft serving and the version unchanged. Both drafts are in memory for
        the moment of the swap.
        """
        if self.closed:
            raise EngineClosedError("engine is closed")
        resolved = _resolve(path)
        try:
            model = self._core.load_draft(resolved)  # no lock: generations go on meanwhile
            with self._locked():
                self._core.swap_draft(model, name)
                self._draft_paths[name] = resolved
                if name == "":
                    self.draft_path = resolved
                return int(self._core.draft_version(name))
        finally:
            _forward_llama_logs()

    # -- draft head (method "redrafter") ----------------------------------------------------------

    def reload_head(self, path: str | os.PathLike[str]) -> int:
        """Loads the draft head GGUF at `path` (pyspec train-head makes one) and installs it for
        method="redrafter"; returns the head's new version.

        As with reload_draft, the file is read and checked against the target while generations
        go on, and swapped in under the engine lock, between two generations. Any failure
        (FileNotFoundError, HeadFileError for a file that is not a valid head, HeadMismatchError
        for a head trained for another target) leaves the old head serving.
        """
        if self.closed:
            raise EngineClosedError("engine is closed")
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"head file not found: {path}")
        try:
            head = self._core.load_head(path)  # no lock: generations go on meanwhile
            with self._locked():
                self._core.swap_head(head)
                return int(self._core.head_version)
        finally:
            _forward_llama_logs()

    def _load_known_head(self) -> None:
        """The head `pyspec train-head` remembered for this target (pyspec.head.known), if any; one
        that no longer loads is skipped with a warning (the engine starts without a head)."""
        from .head.known import known_head

        try:
            path = known_head(self.target_path)
        except OSError as exc:
            log.warning("could not read the known draft heads: %s", exc)
            return
        if path is None:
            return
        try:
            self.reload_head(path)
        except (OSError, SpecError) as exc:
            log.warning("the draft head known for %s does not load; starting without one: %s",
                        os.path.basename(self.target_path), exc)
            return
        log.info("draft head %s (known for %s; head=False: none)", path, os.path.basename(self.target_path))

    def remove_head(self) -> None:
        """Frees the draft head (after a running generation ends); its version count stays."""
        with self._locked():
            self._core.remove_head()

    @property
    def head_version(self) -> int:
        """Heads installed so far: 1 after the first reload_head (or head=), +1 per reload; 0 never."""
        return int(self._core.head_version)

    @property
    def head_path(self) -> str | None:
        return self._core.head_path or None

    # -- static n-gram table (method "auto"'s corpus drafter) --------------------------------------

    def load_ngram(self, path: str | os.PathLike[str]) -> None:
        """Installs the n-gram table at `path` (`pyspec ngram build` makes one; "default": the
        ShareGPT table for this vocabulary in the cache, built first when missing, about two
        minutes) for method auto, which then also drafts the table's predictions where nothing
        is copied (GenerationConfig.auto_corpus). Read and checked against the target's
        vocabulary before it replaces the old table, between two generations; any failure
        (FileNotFoundError, NgramFileError) leaves the old table in place.
        """
        if self.closed:
            raise EngineClosedError("engine is closed")
        if os.fspath(path) == "default":
            from .ngram import ensure_default_table

            path = ensure_default_table(self)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"n-gram table not found: {path}")
        table = self._core.load_ngram(path)  # no lock: generations go on meanwhile
        with self._locked():
            self._core.swap_ngram(table)

    def remove_ngram(self) -> None:
        """Drops the n-gram table (after a running generation ends)."""
        with self._locked():
            self._core.remove_ngram()

    @property
    def ngram_path(self) -> str | None:
        return self._core.ngram_path or None

    @property
    def ngram_size(self) -> int:
        """Entries of the n-gram table (0 without one)."""
        return int(self._core.ngram_size)

    @property
    def vocab_fingerprint(self) -> str:
        """FNV-1a 64 of the target's token texts (16 hex digits): which vocabulary a table or head is for."""
        return str(self._core.vocab_fingerprint)

    def remove_draft(self, name: str) -> None:
        """Frees the draft of slot `name` (after a running generation ends); its version count stays."""
        with self._locked():
            self._core.remove_draft(name)
            self._draft_paths.pop(name, None)
            if name == "":
                self.draft_path = None

    @property
    def n_ctx(self) -> int:
        return int(self._core.n_ctx)

    @property
    def n_vocab(self) -> int:
        return int(self._core.n_vocab)

    # -- text <-> tokens -----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        check_text("text", text)
        return list(self._core.tokenize(text, add_special, parse_special))

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self.detokenize_bytes(tokens, special=special).decode("utf-8", errors="replace")

    def detokenize_bytes(self, tokens: Sequence[int], *, special: bool = False) -> bytes:
        """The tokens' text as raw bytes (a token may end inside a UTF-8 sequence)."""
        return bytes(self._core.detokenize(list(tokens), special))

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token as the output shows them (possibly part of a UTF-8 character)."""
        return bytes(self._core.token_to_piece(int(token), False))

    def is_eog(self, token: int) -> bool:
        """True for the target's end-of-generation tokens (EOS, EOT, ...)."""
        return bool(self._core.is_eog(int(token)))

    @property
    def chat_template(self) -> str | None:
        """The target's own chat template (the GGUF's tokenizer.chat_template Jinja text); None if it has none."""
        return str(self._core.chat_template) or None

    @property
    def special_tokens(self) -> dict[str, Any]:
        """The target's special token ids, -1 where the vocabulary has none: bos, eos, eot,
        fim_prefix, fim_suffix, fim_middle; add_bos: whether tokenize() puts bos first."""
        return dict(self._core.special_tokens)

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            template: str | None = None) -> str:
        """Formats messages ([{"role": ..., "content": ...}]) with the target's chat template, as
        llama.cpp's built-in formatter knows it (`template`: one of its built-in template names,
        pyspec._core.chat_builtin_templates(), instead of the target's own).

        role is a string; content is a string, None (no text: an empty string, as an assistant
        message that only carried tool calls), or OpenAI's list of content parts, whose text parts
        ({"type": "text", "text": ...}) are joined with newlines. Other parts (images, audio,
        files) raise InvalidArgumentError: the models here read text only.
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise TypeError(f"message {i} must be a dict with 'role' and 'content', got {m!r:.80}")
            check_text(f"message {i} role", m["role"])
            pairs.append((m["role"], message_text(m["content"], i)))
        return str(self._core.apply_chat_template(pairs, add_generation_prompt, template or ""))

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """Token ids for a prompt given as text, token ids, or chat messages."""
        if isinstance(prompt, str):
            check_text("prompt", prompt)
            return self.tokenize(prompt)
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (Sequence, np.ndarray)):
            raise TypeError(f"prompt must be a string, a list of token ids, or a list of chat messages, "
                            f"got {type(prompt).__name__}")
        items = list(prompt)
        if items and all(isinstance(m, Mapping) for m in items):
            return self.tokenize(self.apply_chat_template(items))  # type: ignore[arg-type]
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) for t in items):
            tokens = [int(t) for t in items]
            for t in tokens:
                if not 0 <= t < self._n_vocab:
                    raise InvalidArgumentError(f"prompt token {t} outside the vocabulary [0, {self._n_vocab})")
            return tokens
        raise TypeError("prompt must be a string, a list of token ids, or a list of chat messages")

    def evaluate(self, tokens: Sequence[int], *, draft: bool | str = False, all_rows: bool = False,
                 first_row: int = 0) -> np.ndarray:
        """Logits of the target (or a draft: True for the default one, or a slot name) for
        `tokens` evaluated from scratch.

        Returns [n_tokens - first_row, n_vocab] float32 when all_rows (row i is the logits after
        tokens[first_row + i]; earlier rows are not computed), else [1, n_vocab] for the last token.
        """
        use_draft = draft is not False
        name = draft if isinstance(draft, str) else ""
        try:
            with self._locked():
                return np.asarray(self._core.evaluate(list(tokens), use_draft, all_rows, name, first_row))
        finally:
            _forward_llama_logs()

    def evaluate_hidden(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The target's logits and last-layer hidden states for `tokens` evaluated from scratch.

        Returns (logits [n_tokens, n_vocab], hidden [n_tokens, n_hidden]) float32. The hidden
        state is taken after the final norm, so logits = hidden @ output_matrix.T (+ bias): what a
        draft head (pyspec.head) reads.
        """
        try:
            with self._locked():
                logits, hidden = self._core.evaluate_hidden(list(tokens))
                return np.asarray(logits), np.asarray(hidden)
        finally:
            _forward_llama_logs()

    def evaluate_top_k(self, tokens: Sequence[int], k: int, *, first_row: int = 0
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What a draft head trains on, without any full logits row: for rows first_row .. n - 1
        of `tokens` evaluated from scratch, the target's k likeliest next tokens (likeliest first)
        and their probabilities at temperature 1 over the whole vocabulary, and the last-layer
        hidden states (as evaluate_hidden's). Returns (top_ids [n', k] int32, top_probs [n', k]
        float32, hidden [n', n_hidden] float32), n' = n - first_row; the top-k of a batch's rows
        is taken in C++ on the engine's threads."""
        try:
            with self._locked():
                ids, probs, hidden = self._core.evaluate_top_k(list(tokens), int(first_row), int(k))
                return np.asarray(ids), np.asarray(probs), np.asarray(hidden)
        finally:
            _forward_llama_logs()

    def kv_cache_state(self, *, draft: bool | str = False) -> tuple[list[int], list[int]]:
        """What the target's (or a draft's) KV cache holds between requests: the tokens of
        sequence 0 that the next prompt may reuse, and llama.cpp's highest position in each
        sequence (-1: no cell). After a generation only sequence 0 holds cells."""
        use_draft = draft is not False
        name = draft if isinstance(draft, str) else ""
        with self._locked():
            tokens, pos_max = self._core.kv_state(use_draft, name)
        return list(tokens), list(pos_max)

    # -- phrase pool ---------------------------------------------------------------------------
    # The pool is shared by every request of this engine and is safe to use from any thread, also
    # while a generation runs (it takes its own lock, not the engine's).

    def pool_stats(self) -> dict[str, Any]:
        """Size, capacity, memory, inserts by source, lookups, hits and accepted-token credits."""
        return dict(self._core.pool_stats())

    def save_pool(self, path: str | os.PathLike[str]) -> None:
        """Writes the phrase pool to `path` (atomically: a temp file renamed into place)."""
        self._core.save_pool(os.fspath(path))

    def load_pool(self, path: str | os.PathLike[str]) -> None:
        """Replaces the pool by a file from save_pool(); on any error the pool is unchanged
        (PoolFileError for a bad file, VocabMismatchError for another vocabulary)."""
        self._core.load_pool(os.fspath(path))

    def clear_pool(self) -> None:
        self._core.clear_pool()

    # -- method auto's acceptance statistics ----------------------------------------------------

    def save_stats(self, path: str | os.PathLike[str]) -> None:
        """Writes what method auto has learnt of how often each kind of draft node is accepted to
        `path` (JSON, atomically), for a later engine's load_stats (pyspec.acceptance). From any
        thread: waits for a running generation to end (EngineBusyError from inside a stream()
        loop whose generation waits for that loop)."""
        from . import acceptance

        with self._locked():
            acceptance.save(self, path)

    def load_stats(self, path: str | os.PathLike[str]) -> int:
        """Replaces auto's acceptance statistics by a file from save_stats: the engine then plans as
        the requests that taught them left it (each request still checks them against its own
        outcomes); returns how many sets of statistics (one per draft slot and lookup setting)
        it held. StatsFileError for a missing or bad file or another target model; the
        statistics are then unchanged. The draft model's node counts are kept only for a slot
        holding a model of the same kind. Waits for a running generation to end, as save_stats."""
        from . import acceptance

        with self._locked():
            return acceptance.load(self, path)

    # -- cost curves (method "auto") -----------------------------------------------------------

    def calibrate(self, *, force: bool = False, repeats: int = 3, progress: bool | None = None
                  ) -> dict[str, "CostCurve"]:
        """Cost curves of the target and every draft slot (time of one decode of k tokens) for
        method="auto": cached ones (per model file, threads, offload, backend) unless force,
        else measured now (a few seconds per model; progress bar on a terminal) and cached.
        Returns {"target": curve, "draft" or "draft:<name>": curve, ...}."""
        with self._locked():
            curves = {"target": calibration.ensure(self, None, force=force, repeats=repeats, progress=progress)}
            for name in self._core.draft_names():
                key = "draft" if name == "" else f"draft:{name}"
                curves[key] = calibration.ensure(self, name, force=force, repeats=repeats, progress=progress)
        return curves

    def cost_model(self) -> CostModelState | None:
        """The target's cost model as method="auto" plans with it now: the calibrated curve and
        the estimate corrected from the time of every step decoded so far (any method); None
        before any curve was measured or loaded."""
        state = self._core.cost_model()
        return None if state.prior.empty else CostModelState._from_core(state)

    def _ensure_costs(self, config: GenerationConfig) -> None:
        """Installs the curves method auto needs (cache or measurement); engine lock held."""
        calibration.ensure(self, None)
        if config.auto_draft_model and self._core.has_draft_named(config.draft):
            calibration.ensure(self, config.draft)

    # -- generation ----------------------------------------------------------------------------

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, *,
                 on_chunk: Callable[[StreamChunk], bool] | None = None, **options: Any) -> GenerationResult:
        """Generates a completion; the output is exactly the target model's.

        Settings come from `config` (a GenerationConfig) with `options` (any of its fields as
        keywords, e.g. max_tokens=128, method="tree", temperature=0.7) applied on top; see
        GenerationConfig for every knob. Greedy output (temperature 0) is token-identical to
        method="none", except where batched and one-token logits of the backend flip a near-tie
        (docs/numerics.md).

        on_chunk: called on the generating thread with each StreamChunk (newly safe text, the
        tokens generated since the last chunk, their log-probabilities when asked for); return
        False to cancel the generation (finish_reason "cancelled"; the engine stays usable).

        An exception that stops the generation after it started (llama.cpp failed, Ctrl-C, a
        callback raised) carries the output produced so far as `exc.partial_result`, a
        GenerationResult with finish_reason "error"; the engine stays usable.
        """
        cfg = (config or GenerationConfig()).replace(**options)
        return self._run(self.prompt_tokens(prompt), cfg, on_chunk)

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None, **options: Any) -> "TextStream":
        """Like generate(), but yields text pieces as they are produced.

        Iterate over the returned stream for str pieces; `stream.result` holds the
        GenerationResult once iteration ends. Breaking out of the loop (or stream.close())
        cancels the generation; the engine stays usable. The generation holds the engine until it
        ends: an engine call from inside the loop that would wait for it while it waits for the
        loop raises EngineBusyError.
        """
        cfg = (config or GenerationConfig()).replace(**options)
        return TextStream(self, self.prompt_tokens(prompt), cfg)

    def _run(self, tokens: list[int], config: GenerationConfig,
             on_chunk: Callable[[StreamChunk], bool] | None) -> GenerationResult:
        params = config.to_core()
        with_logprobs = config.logprobs is not None
        core_callback = None
        if on_chunk is not None:
            n_reported = 0

            def core_callback(piece: str, so_far: Any) -> bool:
                # so_far is the engine's result in the making, valid during this call only.
                nonlocal n_reported
                since = so_far.since(n_reported)
                n_reported = so_far.n_tokens
                logprobs = TokenLogprobs._from_core(since) if with_logprobs else None
                return bool(on_chunk(StreamChunk(piece, list(since[0]), logprobs)))

        partial = _core.GenerateResult()
        try:
            with self._locked():
                if params.method == "auto":
                    self._ensure_costs(config)
                core_result = self._core.generate(tokens, params, core_callback, partial)
        except BaseException as exc:
            if partial.finish_reason == "error":  # the generation had started: keep its output
                exc.partial_result = self._result(partial, config, params)  # type: ignore[attr-defined]
            raise
        finally:
            _forward_llama_logs()
        return self._result(core_result, config, params)

    def _result(self, core_result: Any, config: GenerationConfig, params: Any) -> GenerationResult:
        logits = core_result.take_logits(self._n_vocab) if config.return_logits else None
        return GenerationResult(
            text=core_result.text,
            tokens=list(core_result.tokens),
            prompt_tokens=list(core_result.prompt_tokens),
            finish_reason=core_result.finish_reason,
            method=params.method,
            stats=GenerationStats._from_core(core_result.stats),
            trace=Trace._from_core(list(core_result.trace), params.trace_top_k),
            logits=None if logits is None else np.asarray(logits),
            draft=config.draft,
            draft_version=int(core_result.draft_version),
            head_version=int(core_result.head_version),
            logprobs=TokenLogprobs._from_core(core_result.since(0)) if config.logprobs is not None else None,
            step_ms=np.asarray(core_result.step_ms, dtype=np.float32),
            step_sizes=np.asarray(core_result.step_sizes, dtype=np.int32),
        )


_DONE = object()


class _StreamChannel:
    """What a stream's worker thread shares with the TextStream (never the stream itself, so that
    a stream dropped unread can be garbage-collected, which cancels its generation)."""

    def __init__(self, max_pending: int) -> None:
        self.queue: "queue.Queue[object]" = queue.Queue(maxsize=max_pending)
        self.cancel = threading.Event()
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None

    def on_chunk(self, chunk: StreamChunk) -> bool:
        """The generation's chunk callback: waits while the consumer is max_pending chunks behind;
        returns False (cancel) once the stream is closed."""
        while not self.cancel.is_set():
            try:
                self.queue.put(chunk, timeout=0.05)
                break
            except queue.Full:
                continue
        return not self.cancel.is_set()


class TextStream:
    """Iterator over the text pieces of one generation running in a worker thread.

    Iterating yields str pieces; chunks() yields StreamChunk objects (text, the tokens since the
    previous chunk and, with logprobs=k, their log-probabilities) instead. Use one or the other.

    Chunks pass through a bounded queue: a consumer that falls behind holds the generation back
    (it runs at most MAX_PENDING chunks ahead) rather than letting it run unseen to its end, so
    that leaving the loop or close() stops it within a few tokens. A stream dropped without being
    read or closed cancels its generation when it is garbage-collected.
    """

    MAX_PENDING = 16

    def __init__(self, engine: Engine, tokens: list[int], config: GenerationConfig) -> None:
        channel = _StreamChannel(self.MAX_PENDING)
        self._channel = channel
        reader = threading.get_ident()

        def work() -> None:
            me = threading.get_ident()
            engine._stream_workers[me] = (reader, channel)
            try:
                channel.result = engine._run(tokens, config, channel.on_chunk)
            except BaseException as exc:  # handed to the consumer thread
                channel.error = exc
            finally:
                engine._stream_workers.pop(me, None)
                try:
                    channel.queue.put_nowait(_DONE)
                except queue.Full:  # the consumer sees the worker gone once it has drained the queue
                    pass

        self._thread = threading.Thread(target=work, name="pyspec-stream", daemon=True)
        self._thread.start()

    @property
    def result(self) -> GenerationResult | None:
        """The GenerationResult once the generation has ended (None before, or after an error)."""
        return self._channel.result

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            yield chunk.text

    def chunks(self) -> Iterator[StreamChunk]:
        channel = self._channel
        try:
            while True:
                try:
                    item = channel.queue.get(timeout=0.05)
                except queue.Empty:
                    if not self._thread.is_alive() and channel.queue.empty():
                        break
                    continue
                if item is _DONE:
                    break
                yield item  # type: ignore[misc]
        finally:
            self.close()
        if channel.error is not None:
            raise channel.error

    def close(self) -> None:
        """Cancels the generation if it is still running and waits for the worker."""
        self._channel.cancel.set()
        self._thread.join()

    def __del__(self) -> None:
        self._channel.cancel.set()  # no join here: __del__ may run on any thread
