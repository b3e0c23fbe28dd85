"""The peers `pyspec bench` runs beside pyspec's methods.

- llama-cpp-python (`peer-llama-cpp`, `peer-pld`): the Python binding's plain generation and its
  prompt-lookup decoding, in this process, from the same prompt token ids.
- llama.cpp's own tools (`llama.cpp`, `llama.cpp-ngram-simple`, `llama.cpp-ngram-map-k`,
  `llama.cpp-ngram-mod`, `llama.cpp-draft`): `llama-completion` and `llama-speculative-simple`
  built from the pinned llama.cpp (`pyspec.bench.llamacpp`), one process per generation, from the same
  prompt text (their prompt token count is checked against the engine's).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

from .report import PromptRun
from .llamacpp import LlamaCppToolsError
from .llamacpp_run import ToolRun, ToolSettings, run_completion, run_speculative

PYTHON_PEERS = ("peer-llama-cpp", "peer-pld")
PEER_PLD_N_DRAFT = 10  # LlamaPromptLookupDecoding's num_pred_tokens default
# method -> llama-speculative-simple --spec-type (None: llama-completion, plain decoding)
LLAMA_CPP_PEERS: dict[str, str | None] = {
    "llama.cpp": None,
    "llama.cpp-ngram-simple": "ngram-simple",
    "llama.cpp-ngram-map-k": "ngram-map-k",
    "llama.cpp-ngram-mod": "ngram-mod",
    "llama.cpp-draft": "draft-simple",
}
LLAMA_CPP_DRAFT = "llama.cpp-draft"  # the one that loads the draft model (-md); ':K' sets --spec-draft-n-max
LLAMA_CPP_DEFAULT_N_DRAFT = 3  # llama-speculative-simple's --spec-draft-n-max default at 0c1e570
TOOL_TIMEOUT_S = 1800.0


class PythonPeer:
    """A llama-cpp-python model generating from token ids: greedily, or at temperature > 0 by plain
    temperature sampling (top-k, top-p and min-p off), from the seed when one is given."""

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, repack: bool, n_draft: int | None,
                 pld: bool, flash_attn: bool = False, temperature: float = 0.0, seed: int | None = None) -> None:
        self.temperature, self.seed = temperature, seed
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft_model = LlamaPromptLookupDecoding(num_pred_tokens=n_draft or PEER_PLD_N_DRAFT) if pld else None
        # Llama builds its model params from llama_cpp.llama_model_default_params() inside
        # __init__ and loads the model right away, with no parameter for use_extra_bufts. When
        # pyspec runs with repacking off (AMX CPUs, whose AMX extra-buffer kernels crash with
        # SIGILL), the peer must too: swap that one function for the duration of the
        # constructor, so the defaults it returns carry use_extra_bufts = False.
        with _model_defaults(use_extra_bufts=repack):
            self.llm = llama_cpp.Llama(
                model_path=model_path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=n_threads,
                n_threads_batch=n_threads, flash_attn=flash_attn, draft_model=draft_model, verbose=False,
            )
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._is_eog = lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))

    def generate(self, prompt_tokens: list[int], max_tokens: int) -> tuple[list[int], str]:
        """The tokens after prompt_tokens, without the end-of-generation token (as pyspec)."""
        self.llm.reset()  # evaluate the whole prompt every time, as pyspec does
        if self.seed is not None:
            self.llm.set_seed(self.seed)
        tokens: list[int] = []
        sampled = self.temperature > 0
        gen = self.llm.generate(prompt_tokens, temp=self.temperature if sampled else 0.0, top_k=0 if sampled else 1,
                                top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        try:
            for token in gen:
                if self._is_eog(token):
                    return tokens, "stop"
                tokens.append(int(token))
                if len(tokens) >= max_tokens:
                    return tokens, "length"
        finally:
            gen.close()
        return tokens, "stop"

    def run(self, label: str, prompt_id: str, prompt_tokens: list[int], max_tokens: int) -> PromptRun:
        t0 = time.perf_counter()
        tokens, finish = self.generate(prompt_tokens, max_tokens)
        wall = time.perf_counter() - t0
        return PromptRun(prompt_id, label, len(prompt_tokens), len(tokens), wall,
                         len(tokens) / wall if wall else 0.0, finish, tokens)

    def close(self) -> None:
        self.llm.close()


@contextlib.contextmanager
def _model_defaults(*, use_extra_bufts: bool) -> Iterator[None]:
    import llama_cpp.llama_cpp as lib

    if use_extra_bufts:
        yield
        return
    original = lib.llama_model_default_params

    def defaults() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = defaults
    try:
        yield
    finally:
        lib.llama_model_default_params = original


class LlamaCppPeer:
    """One of llama.cpp's tools in one mode (LLAMA_CPP_PEERS), with the engine's settings."""

    def __init__(self, name: str, bin_dir: Path, settings: ToolSettings, *, draft: str | None = None,
                 n_draft: int | None = None) -> None:
        if name not in LLAMA_CPP_PEERS:
            raise ValueError(f"unknown llama.cpp peer {name!r}; known: {', '.join(LLAMA_CPP_PEERS)}")
        if name == LLAMA_CPP_DRAFT and draft is None:
            raise ValueError(f"{name} needs a draft model")
        self.name = name
        self.spec_type = LLAMA_CPP_PEERS[name]
        self.bin_dir = bin_dir
        self.settings = settings
        self.draft = draft if name == LLAMA_CPP_DRAFT else None
        self.n_draft = n_draft if name == LLAMA_CPP_DRAFT else None

    @property
    def renders_special_tokens(self) -> bool:
        """llama-speculative-simple prints special tokens as text, llama-completion (without -sp) as ""."""
        return self.spec_type is not None

    def generate(self, prompt_file: Path, max_tokens: int) -> ToolRun:
        if self.spec_type is None:
            return run_completion(self.bin_dir, self.settings, prompt_file, max_tokens, timeout_s=TOOL_TIMEOUT_S)
        return run_speculative(self.bin_dir, self.settings, prompt_file, max_tokens, self.spec_type, self.draft,
                               self.n_draft, timeout_s=TOOL_TIMEOUT_S)

    def run(self, label: str, prompt_id: str, prompt_file: Path, n_prompt_tokens: int, max_tokens: int) -> PromptRun:
        """One generation; raises LlamaCppToolsError when the tool tokenized the prompt differently."""
        r = self.generate(prompt_file, max_tokens)
        if r.n_prompt_tokens != n_prompt_tokens:
            raise LlamaCppToolsError(
                f"{label} on {prompt_id}: the tool read the prompt as {r.n_prompt_tokens} tokens, the engine as "
                f"{n_prompt_tokens}; the two would not generate from the same input")
        return PromptRun(
            prompt_id, label, r.n_prompt_tokens, r.n_generated, r.wall_s,
            r.n_generated / r.wall_s if r.wall_s else 0.0, r.finish_reason, [],
            decode_tokens_per_second=r.decode_tokens_per_second,
            decode_tokens_per_second_within_limit=r.decode_tokens_per_second_within_limit, n_drafted=r.n_drafted,
            n_accepted=r.n_accepted,
            text=r.text, process_wall_s=r.process_s,
        )  # fmt: skip
