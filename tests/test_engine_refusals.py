"""Inputs that llama.cpp or ggml would end the process on come back through `_core` as typed Python
errors: head steps with rows outside the head's table, head weights of a type no matmul takes,
texts longer than llama.cpp's int32 lengths, and models whose memory cannot drop a rejected draft.

Each check runs in a child process (tests/isolated.py): an abort fails one test with its exit
status instead of ending the test run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from isolated import run_json

torch = pytest.importorskip("torch")

from pyspec.head.gguf_io import export_head, new_head, read_target  # noqa: E402

KEPT = 300
GGML_TYPE_I32 = 26


@pytest.fixture(scope="module")
def head_file(tmp_path_factory: pytest.TempPathFactory, tiny_target: str) -> Path:
    """An untrained f32 head for the tiny target (the weights do not matter here)."""
    vocab = np.arange(KEPT)
    weights = read_target(tiny_target, vocab)
    torch.manual_seed(0)
    head = new_head(weights, vocab, n_res_layers=1)
    return export_head(head, weights.info, tmp_path_factory.mktemp("head") / "head.gguf", dtype="f32")


def copy_with_tensor_type(source: Path, dest: Path, tensor: str, ggml_type: int) -> None:
    """Writes `source` to `dest` with `tensor`'s type field set to `ggml_type` (same element size,
    so the layout stays valid)."""
    import gguf

    reader = gguf.GGUFReader(source)
    info = next(t for t in reader.tensors if t.name == tensor)
    type_part = info.field.parts[-2]  # name length, name, n_dims, dims, type, offset
    assert type_part.dtype == np.uint32 and int(type_part[0]) == int(gguf.GGMLQuantizationType.F32)
    data = bytearray(source.read_bytes())
    offset = type_part.ctypes.data - reader.data.ctypes.data
    data[offset : offset + 4] = np.uint32(ggml_type).tobytes()
    dest.write_bytes(bytes(data))


STEP_ROWS = """
import json, sys
import numpy as np
import pyspec
from pyspec import InvalidArgumentError
engine = pyspec.Engine(sys.argv[1], n_ctx=256, n_threads=1)
head = engine._core.load_head(sys.argv[2])
d, kept = head.n_embd, head.n_kept
hidden = np.zeros((1, d), dtype=np.float32)
out = {"kept": kept}
head.step(hidden, hidden, [kept])  # the row tokens outside the kept vocabulary share
for row in (kept + 1, -1, 1 << 30):
    try:
        head.step(hidden, hidden, [row])
        out[str(row)] = "ran"
    except InvalidArgumentError as e:
        out[str(row)] = str(e)
print(json.dumps(out))
"""


def test_head_step_refuses_rows_outside_its_table(tiny_target: str, head_file: Path) -> None:
    out = run_json(STEP_ROWS, tiny_target, str(head_file))
    kept = out["kept"]
    for row in (kept + 1, -1, 1 << 30):
        assert f"row {row}" in out[str(row)] and f"[0, {kept}]" in out[str(row)], out


LOAD_TYPED = """
import json, sys
import numpy as np
import pyspec
from pyspec import HeadFileError
engine = pyspec.Engine(sys.argv[1], n_ctx=256, n_threads=1)
try:
    head = engine._core.load_head(sys.argv[2])
except HeadFileError as e:
    print(json.dumps({"refused": str(e)}))
    raise SystemExit(0)
hidden = np.zeros((1, head.n_embd), dtype=np.float32)
head.step(hidden, hidden, [0])
print(json.dumps({"refused": None}))
"""


def test_head_weights_of_an_integer_type_are_refused_at_load(tiny_target: str, head_file: Path,
                                                            tmp_path: Path) -> None:
    bad = tmp_path / "i32_weight.gguf"
    copy_with_tensor_type(head_file, bad, "head.rnn_w.weight", GGML_TYPE_I32)
    out = run_json(LOAD_TYPED, tiny_target, str(bad))
    assert out["refused"] and "head.rnn_w.weight" in out["refused"] and "i32" in out["refused"], out


# The child's address space is capped so that a size check that comes too late (after buffers
# sized from the text) fails as MemoryError instead of taking the machine's memory.
HUGE_TEXT = """
import json, resource, sys
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
import pyspec
from pyspec import InvalidArgumentError
engine = pyspec.Engine(sys.argv[1], n_ctx=256, n_threads=1)
text = "a" * ((1 << 31) + 16)
out = {}
try:
    engine._core.tokenize(text, False, False)
    out["tokenize"] = "ran"
except InvalidArgumentError as e:
    out["tokenize"] = str(e)
except MemoryError:
    out["tokenize"] = "MemoryError"
try:
    engine._core.apply_chat_template([("user", text)], True)
    out["template"] = "ran"
except InvalidArgumentError as e:
    out["template"] = str(e)
except MemoryError:
    out["template"] = "MemoryError"
print(json.dumps(out))
"""


def test_texts_beyond_int32_lengths_are_refused(tiny_target: str) -> None:
    cap = 7 << 30
    try:
        available = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemAvailable")))
    except (OSError, StopIteration):
        available = 0
    if available * 1024 < cap:
        pytest.skip("needs 7 GiB of free memory for a 2 GiB text")
    out = run_json(HUGE_TEXT, tiny_target, str(cap), timeout=600)
    assert "text of 2147483664 bytes" in out["tokenize"] and "2147483647 bytes" in out["tokenize"], out
    assert "messages of 2147483668 bytes" in out["template"] and "1073741567 bytes" in out["template"], out


def build_tiny_mamba(path: Path, n_embd: int = 32, n_layer: int = 2, d_state: int = 8, d_conv: int = 4,
                     dt_rank: int = 4) -> Path:
    """A tiny random `mamba` GGUF (llama.cpp's recurrent memory) over the tiny models' vocabulary."""
    import gguf

    from pyspec._models import tiny

    tokens, token_types, merges = tiny.build_vocab(200)
    eos = tokens.index(tiny.EOS_TEXT)
    writer = gguf.GGUFWriter(None, "mamba")
    writer.add_name("pyspec-tiny-mamba")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(2048)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(2 * n_embd)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    rng = np.random.RandomState(0)
    d_inner = 2 * n_embd

    def add(name: str, shape: tuple[int, ...], std: float | None = None) -> None:
        values = np.ones(shape) if std is None else std * rng.standard_normal(shape)
        writer.add_tensor(name, values.astype(np.float32))

    add("token_embd.weight", (len(tokens), n_embd), 1.0)
    for layer in range(n_layer):
        blk = f"blk.{layer}"
        add(f"{blk}.attn_norm.weight", (n_embd,))
        add(f"{blk}.ssm_in.weight", (2 * d_inner, n_embd), 0.2)
        add(f"{blk}.ssm_conv1d.weight", (d_inner, d_conv), 0.3)
        add(f"{blk}.ssm_conv1d.bias", (d_inner,), 0.1)
        add(f"{blk}.ssm_x.weight", (dt_rank + 2 * d_state, d_inner), 0.2)
        add(f"{blk}.ssm_dt.weight", (d_inner, dt_rank), 0.2)
        add(f"{blk}.ssm_dt.bias", (d_inner,), 0.1)
        writer.add_tensor(f"{blk}.ssm_a", -np.exp(0.3 * rng.standard_normal((d_inner, d_state))).astype(np.float32))
        add(f"{blk}.ssm_d", (d_inner,))
        add(f"{blk}.ssm_out.weight", (n_embd, d_inner), 0.2)
    add("output_norm.weight", (n_embd,))
    add("output.weight", (len(tokens), n_embd), 1.0)
    return tiny.write_gguf(writer, path)


def test_a_recurrent_target_decodes_plainly_and_refuses_drafts(tmp_path: Path) -> None:
    """A recurrent state cannot drop its last positions: plain decoding reuses no cached prefix
    (and gives a fresh engine's tokens), and every drafting method is refused before it starts."""
    import pyspec
    from pyspec import InvalidArgumentError

    path = str(build_tiny_mamba(tmp_path / "mamba.gguf"))
    first, second = list(range(5, 20)), list(range(5, 20)) + [30, 31]
    with pyspec.Engine(path, n_ctx=256, n_threads=1) as engine, pyspec.Engine(path, n_ctx=256, n_threads=1) as fresh:
        engine.generate(first, max_tokens=8, method="none")
        again = engine.generate(second, max_tokens=8, method="none")
        assert again.tokens == fresh.generate(second, max_tokens=8, method="none").tokens
        assert again.stats.n_prompt_cached == 0
        for method in ("lookup", "auto"):
            with pytest.raises(InvalidArgumentError, match="recurrent state"):
                engine.generate(first, max_tokens=8, method=method)
