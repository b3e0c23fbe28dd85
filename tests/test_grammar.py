"""Constrained output: a GBNF grammar or a JSON schema masks the target's rows, drafts are cut at
the first token the grammar forbids, and every method reproduces constrained plain decoding
(greedy: token for token; sampled: the masked distribution, chi-square)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pyspec import GenerationConfig, InvalidArgumentError, _core
from pyspec.grammar import json_schema_grammar
from test_greedy import PROMPTS
from test_sampling import ALPHA, chi_square_pvalue, first_two_joint

WORDS = r'root ::= [a-z]+ (" " [a-z]+)*'
WORDS_RE = re.compile(r"[a-z]+( [a-z]+)*")
CHOICE = 'root ::= "yes" | "no" | "maybe so"'
# Long enough that no two tokens of the tiny vocabulary complete it: the end of text is never
# allowed within the first two tokens.
LETTERS = "root ::= [a-z]{40,}"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "count": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
}
METHODS = [dict(method="chain"), dict(method="tree"), dict(method="beam"), dict(method="lookup"),
           dict(method="ouroboros"), dict(method="auto")]


@pytest.mark.parametrize("options", METHODS, ids=lambda o: o["method"])
@pytest.mark.parametrize("grammar", [WORDS, CHOICE], ids=["words", "choice"])
def test_greedy_grammar_output_equals_constrained_plain_decoding(engines, options, grammar) -> None:
    engine = engines["perturbed"]
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=40, method="none", grammar=grammar)
        spec = engine.generate(prompt, max_tokens=40, grammar=grammar, **options)
        assert spec.tokens == plain.tokens, (prompt, options)
        if grammar == CHOICE:
            assert plain.text in ("yes", "no", "maybe so") and plain.finish_reason == "stop", plain.text
        else:
            assert WORDS_RE.fullmatch(plain.text.rstrip(" ")), plain.text
    unconstrained = engine.generate(PROMPTS[0], max_tokens=40, method="none")
    assert not WORDS_RE.fullmatch(unconstrained.text), "the grammar must change this output for the test to mean anything"


def test_drafts_hold_only_tokens_the_grammar_allows(engines) -> None:
    """Prompt lookup would copy the prompt's capitals and punctuation; the grammar cuts those
    drafts before verification, so every drafted token is lower-case words."""
    engine = engines["identical"]
    prompt = "the cat sat. The Cat Sat, the cat sat! the cat sat. the"
    plain = engine.generate(prompt, max_tokens=48, method="none", grammar=WORDS)
    spec = engine.generate(prompt, max_tokens=48, method="lookup", grammar=WORDS, trace_top_k=1)
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0
    allowed = re.compile(r"[a-z ]*")
    for step in range(spec.trace.n_steps):
        drafted = engine.detokenize(spec.trace.drafted(step))
        assert allowed.fullmatch(drafted), drafted


def test_json_schema_output_validates_and_equals_plain(engines) -> None:
    engine = engines["perturbed"]
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, max_tokens=120, method="none", json_schema=SCHEMA)
        for method in ("chain", "lookup", "auto"):
            assert engine.generate(prompt, max_tokens=120, method=method, json_schema=SCHEMA).tokens == plain.tokens
        if plain.finish_reason == "stop":
            doc = json.loads(plain.text)
            assert set(doc) == {"name", "count", "tags"} and isinstance(doc["count"], int), doc
            assert len(doc["name"]) <= 12 and set(doc["tags"]) <= {"a", "b"}, doc
        else:  # cut at max_tokens: a prefix of a document
            assert plain.text.startswith('{') and plain.finish_reason == "length", plain.text


def masked_probs(engine, tokens: list[int], allowed: np.ndarray, **sampling) -> np.ndarray:
    params = _core.SamplingParams()
    for k, v in sampling.items():
        setattr(params, k, v)
    logits = np.array(engine.evaluate(tokens)[0], dtype=np.float32)
    logits[~allowed] = -np.inf
    return np.asarray(_core.compute_probs(np.ascontiguousarray(logits), params), dtype=np.float64)


@pytest.mark.parametrize("kind,options", [("perturbed", dict(method="chain", n_draft=3)),
                                          ("perturbed", dict(method="tree")),
                                          ("identical", dict(method="lookup"))],
                         ids=["chain", "tree", "lookup"])
def test_sampled_grammar_output_follows_the_masked_distribution(engines, kind, options) -> None:
    """The joint distribution of the first two sampled tokens (T = 1, top_k 6) against the target's
    rows restricted, in Python, to the tokens made of lower-case letters only (what LETTERS
    allows before its 40th letter)."""
    engine = engines[kind]
    letters = np.array([bool(re.fullmatch(rb"[a-z]+", engine.token_bytes(t))) for t in range(engine.n_vocab)])
    prompt = engine.tokenize("the cat sat on the mat and the cat sat on the")
    sampling = dict(temperature=1.0, top_k=6)
    joint = first_two_joint(lambda tokens: masked_probs(engine, tokens, letters, **sampling), prompt)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    n_drafted = 0
    for seed in range(1500):
        r = engine.generate(prompt, max_tokens=3, seed=seed, grammar=LETTERS, **sampling, **options)
        counts[index.get((r.tokens[0], r.tokens[1]), len(cells))] += 1
        n_drafted += r.stats.n_drafted
    assert counts[-1] == 0, "sampled a pair the constrained target gives probability 0"
    assert n_drafted > 0
    expected = np.array([joint[c] for c in cells])
    assert chi_square_pvalue(counts[:-1], expected / expected.sum()) > ALPHA


def test_bad_grammars_are_clear_errors_and_the_engine_stays_usable(engines) -> None:
    engine = engines["perturbed"]
    with pytest.raises(InvalidArgumentError, match="grammar could not be parsed"):
        engine.generate("x", max_tokens=4, grammar="root ::= (")
    with pytest.raises(InvalidArgumentError, match="no rule 'start'"):
        engine.generate("x", max_tokens=4, grammar=CHOICE, grammar_root="start")
    with pytest.raises(InvalidArgumentError, match="grammar is empty"):
        engine.generate("x", max_tokens=4, grammar="  \n")
    with pytest.raises(InvalidArgumentError, match="not both"):
        engine.generate("x", max_tokens=4, grammar=CHOICE, json_schema=SCHEMA)
    with pytest.raises(InvalidArgumentError, match="json_schema is not valid JSON"):
        engine.generate("x", max_tokens=4, json_schema="{not json")
    with pytest.raises(TypeError, match="json_schema must be"):
        GenerationConfig(json_schema=3)
    assert engine.generate("x", max_tokens=8, method="none").tokens == \
        engine.generate("x", max_tokens=8, method="chain").tokens


def test_json_schema_grammar_keeps_the_property_order() -> None:
    gbnf = json_schema_grammar({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                                "required": ["b", "a"]})
    root = next(line for line in gbnf.splitlines() if line.startswith("root ::="))
    assert root.index("b-kv") < root.index("a-kv"), gbnf
    assert json_schema_grammar(json.dumps(SCHEMA)) == json_schema_grammar(SCHEMA)


FORCED = 'root ::= "The answer is: " ("yes" | "no" | "maybe") ". Done."'


def test_grammar_drafts_propose_the_forced_text(engines) -> None:
    """Prompt lookup finds nothing to copy here; the text the grammar forces is drafted instead,
    and the output is constrained plain decoding's, with and without those drafts."""
    engine = engines["perturbed"]
    plain = engine.generate("x", max_tokens=30, method="none", grammar=FORCED)
    assert plain.text.startswith("The answer is: ") and plain.text.endswith(". Done."), plain.text
    on = engine.generate("x", max_tokens=30, method="lookup", grammar=FORCED, pool=False)
    off = engine.generate("x", max_tokens=30, method="lookup", grammar=FORCED, pool=False, grammar_drafts=False)
    assert on.tokens == plain.tokens == off.tokens
    assert on.stats.n_accepted >= 10 + off.stats.n_accepted, (on.stats, off.stats)
    assert on.stats.n_target_calls < off.stats.n_target_calls


def test_sampled_output_with_grammar_drafts_follows_constrained_plain_sampling(engines) -> None:
    """Two-sample chi-square: outputs of a small language with forced text between its choices,
    sampled with grammar drafts (lookup finds nothing else) and with plain decoding."""
    from scipy import stats as sps

    engine = engines["perturbed"]
    grammar = 'root ::= ("cat" | "dog" | "cow") " and the " ("red" | "blue") " one"'
    counts = {}
    for column, options in enumerate([dict(method="none"), dict(method="lookup", pool=False)]):
        n_drafted = 0
        for seed in range(1500):
            r = engine.generate("x", max_tokens=20, temperature=1.0, seed=seed, grammar=grammar, **options)
            counts.setdefault(r.text, [0, 0])[column] += 1
            n_drafted += r.stats.n_drafted
        assert column == 0 or n_drafted > 1500
    assert len(counts) == 6 and all(re.fullmatch(r"(cat|dog|cow) and the (red|blue) one", t) for t in counts)
    table = np.array(list(counts.values()))
    assert sps.chi2_contingency(table).pvalue > ALPHA, counts
