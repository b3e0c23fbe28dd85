"""One source of defaults: GenerationConfig defines every generation default; the command line,
the server and the documentation must agree with it. Each test here fails when a default is
changed in one place only."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pyspec.calibration import CALIBRATION_SIZES
from pyspec.cli.main import build_parser
from pyspec.config import DEFAULT_N_DRAFT, SERVER_TEMPERATURE, GenerationConfig

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = GenerationConfig()
FIELDS = {f.name: f for f in dataclasses.fields(GenerationConfig)}

# `pyspec generate` flags that invert a GenerationConfig switch.
NEGATED_FLAGS = {"auto_no_draft_model": "auto_draft_model", "auto_no_head": "auto_head"}
# Flags that share a GenerationConfig field's name but set something else: --draft is the draft
# model's file (the config's `draft` is a slot name); serve's --seed seeds the engine's stream.
NOT_CONFIG = {"generate": {"draft"}, "serve": {"draft", "seed"}}



def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def config_view(args) -> dict[str, object]:
    """The GenerationConfig fields a command's parsed arguments set, under the config's names."""
    seen: dict[str, object] = {}
    for dest, value in vars(args).items():
        if dest in NOT_CONFIG.get(args.command, ()):
            continue
        if dest in NEGATED_FLAGS:
            seen[NEGATED_FLAGS[dest]] = not value
        elif dest in FIELDS:
            seen[dest] = value
    if seen.get("method") == "auto":  # the config spells the default method None ("auto")
        seen["method"] = DEFAULTS.resolved_method()
    return seen


def expected(name: str, overrides: dict[str, object] | None = None) -> object:
    value = (overrides or {}).get(name, getattr(DEFAULTS, name))
    return DEFAULTS.resolved_method() if name == "method" and value is None else value


def test_generate_flags_default_to_the_config() -> None:
    seen = config_view(parse("generate", "--target", "t.gguf", "--prompt", "x"))
    # The flags cover the knobs a user tunes from the shell; each one defaults to the config's value.
    assert {"max_tokens", "temperature", "method", "n_draft", "lookup_ngram_max", "lookup_ngram_min",
            "auto_max_depth", "auto_max_nodes", "tree_nodes", "beams"} <= set(seen)
    drift = {name: (value, expected(name)) for name, value in seen.items() if value != expected(name)}
    assert not drift, f"pyspec generate defaults (flag, config) that differ: {drift}"


def test_serve_request_defaults_are_the_config_but_for_the_temperature() -> None:
    seen = config_view(parse("serve", "--target", "t.gguf"))
    assert {"method", "n_draft", "temperature", "top_p", "top_k", "min_p"} <= set(seen)
    server = {"temperature": SERVER_TEMPERATURE}
    drift = {name: (value, expected(name, server)) for name, value in seen.items() if value != expected(name, server)}
    assert not drift, f"pyspec serve request defaults (flag, expected) that differ: {drift}"


def test_server_settings_default_to_the_config_but_for_the_temperature() -> None:
    pytest.importorskip("fastapi")
    from pyspec.server import ServerSettings

    assert ServerSettings(target="t.gguf").defaults == GenerationConfig(temperature=SERVER_TEMPERATURE)


def test_every_generation_setting_is_a_server_field() -> None:
    from pyspec.server.protocol import SPECULATIVE_FIELDS

    # Set by OpenAI's own request fields (max_tokens, temperature, top_p, stop, seed, logprobs).
    openai = {"max_tokens", "temperature", "top_p", "stop", "seed", "logprobs", "presence_penalty", "frequency_penalty",
              "logit_bias"}
    # Library-only outputs with no place in an HTTP response, and how the engine reads rows.
    library_only = {"trace_top_k", "return_logits", "backend_argmax"}
    assert set(SPECULATIVE_FIELDS) <= set(FIELDS), set(SPECULATIVE_FIELDS) - set(FIELDS)
    missing = set(FIELDS) - set(SPECULATIVE_FIELDS) - openai - library_only
    assert not missing, f"GenerationConfig fields a server request cannot set: {sorted(missing)}"


def test_bench_samples_like_the_library_by_default() -> None:
    assert parse("bench").temperature == DEFAULTS.temperature


def test_calibration_sizes_match_the_engine_and_the_help() -> None:
    source = (REPO / "engine" / "src" / "calibrate.cpp").read_text(encoding="utf-8")
    found = re.search(r"default_calibration_sizes\(\)\s*\{\s*return\s*\{([0-9,\s]+)\}", source)
    assert found, "default_calibration_sizes() not found in engine/src/calibrate.cpp"
    assert tuple(int(k) for k in found.group(1).split(",")) == CALIBRATION_SIZES
    parser = build_parser()
    calibrate = parser._subparsers._group_actions[0].choices["calibrate"]  # type: ignore[union-attr]
    assert f"{CALIBRATION_SIZES[0]}..{CALIBRATION_SIZES[-1]} tokens" in calibrate.description


def docs_defaults_table() -> dict[str, str]:
    """The GenerationConfig table of docs/python-api.md: {field: default as written}."""
    text = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    start = text.index("<!-- defaults table -->")
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", text[start:], flags=re.M)
    assert rows, "no rows after <!-- defaults table --> in docs/python-api.md"
    return dict(rows)


def test_docs_table_lists_every_field_with_its_default() -> None:
    table = docs_defaults_table()
    assert set(table) == set(FIELDS), (sorted(set(FIELDS) - set(table)), sorted(set(table) - set(FIELDS)))
    drift = {name: (written, repr(getattr(DEFAULTS, name))) for name, written in table.items()
             if written != repr(getattr(DEFAULTS, name))}
    assert not drift, f"docs/python-api.md defaults (written, config) that differ: {drift}"


def test_docs_state_the_server_temperature_and_draft_lengths() -> None:
    text = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    server = (REPO / "docs" / "server.md").read_text(encoding="utf-8")
    assert f"temperature {SERVER_TEMPERATURE}" in server
    for method, n in DEFAULT_N_DRAFT.items():
        assert f"{method} {n}" in text, f"docs/python-api.md does not say n_draft defaults to {n} for {method}"
