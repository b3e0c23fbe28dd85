"""Constrained output: GBNF grammars and JSON schemas for GenerationConfig.grammar / json_schema.

The engine masks the target's rows with llama.cpp's grammar sampler and cuts drafts at the first
token the grammar forbids (docs/constrained-output.md). A JSON schema becomes a GBNF grammar
through llama-cpp-python's converter (the package whose libllama the engine links).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from .errors import InvalidArgumentError

# What response_format {"type": "json_object"} asks for: any JSON object.
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


def json_schema_grammar(schema: dict[str, Any] | str) -> str:
    """The GBNF grammar (root rule "root") of the JSON documents `schema` allows. schema: a JSON
    schema as a dict or as JSON text. Raises InvalidArgumentError for a schema that is not JSON
    or that the converter cannot express (it names the part)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"json_schema is not valid JSON: {exc}") from None
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise InvalidArgumentError(f"json_schema must be a JSON object (a dict), got {type(schema).__name__}")
    try:
        text = json.dumps(schema)  # key order kept: it is the order properties are written in
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"json_schema cannot be written as JSON: {exc}") from None
    return _convert(text)


@functools.lru_cache(maxsize=64)
def _convert(schema_text: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # loads llama-cpp-python: only when asked

    try:
        return json_schema_to_gbnf(schema_text)
    except Exception as exc:  # the converter raises bare Exception / ValueError / KeyError
        raise InvalidArgumentError(f"json_schema cannot be turned into a grammar: {exc}") from None
