"""`pyspec generate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..config import METHODS, GenerationConfig
from .options import (add_engine_options, add_rpc_option, add_generation_options, add_ngram_option, add_stats_option, engine_options,
                      penalty_kwargs, read_prompt, stats_file_path)


def _constraint(args: argparse.Namespace) -> dict[str, Any]:
    """GenerationConfig's grammar / json_schema from --grammar / --json-schema (files)."""
    if args.grammar and args.json_schema:
        raise SystemExit("pyspec generate: give --grammar or --json-schema, not both")
    try:
        if args.grammar:
            return {"grammar": Path(args.grammar).read_text(encoding="utf-8")}
        if args.json_schema:
            return {"json_schema": Path(args.json_schema).read_text(encoding="utf-8")}
    except OSError as exc:
        raise SystemExit(f"pyspec generate: cannot read {exc.filename}: {exc.strerror}") from None
    return {}


def _cmd_generate(args: argparse.Namespace) -> int:
    from ..engine import Engine

    prompt_text = read_prompt(args)
    constraint = _constraint(args)
    with Engine(args.target, draft=args.draft, n_ctx=args.n_ctx, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, head=False if args.no_head else args.head, ngram=args.ngram, rpc=args.rpc,
                **engine_options(args)) as engine:
        stats_path = stats_file_path(args, engine)
        prompt: Any = [{"role": "user", "content": prompt_text}] if args.chat else prompt_text
        kwargs = dict(
            max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, stop=args.stop, method=args.method, n_draft=args.n_draft, seed=args.seed,
            lookup_ngram_max=args.lookup_ngram_max, lookup_ngram_min=args.lookup_ngram_min,
            tree_nodes=args.tree_nodes, tree_depth=args.tree_depth, tree_branching=args.tree_branching,
            tree_expand=args.tree_expand, beams=args.beams, beam_length=args.beam_length,
            acceptance=args.acceptance, typical_epsilon=args.typical_epsilon, typical_delta=args.typical_delta,
            auto_max_depth=args.auto_max_depth, auto_max_nodes=args.auto_max_nodes,
            auto_max_gamma=args.auto_max_gamma, auto_draft_model=not args.auto_no_draft_model,
            auto_head_tree_nodes=args.auto_head_tree_nodes,
            auto_head=not args.auto_no_head, **penalty_kwargs(args), **constraint,
        )
        if args.json:
            result = engine.generate(prompt, **kwargs)
            if stats_path is not None:
                engine.save_stats(stats_path)
            print(json.dumps(result.to_dict(), ensure_ascii=False))
            return 0
        stream = engine.stream(prompt, **kwargs)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        result = stream.result
        assert result is not None
        if stats_path is not None:
            engine.save_stats(stats_path)
        s = result.stats
        print(file=sys.stdout)
        print(
            f"[{result.method}] {s.n_generated} tokens, {s.tokens_per_second:.1f} tok/s, "
            f"acceptance {s.acceptance_rate:.2f}, {s.tokens_per_target_call:.2f} tokens/target call, "
            f"finish: {result.finish_reason}",
            file=sys.stderr,
        )
    return 0


def register(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text with a target (and draft) model")
    gen.add_argument("--target", required=True, help="GGUF path or registry name")
    gen.add_argument("--draft", default=None, help="GGUF path or registry name of the draft model")
    gen.add_argument("--head", default=None,
                     help="draft head GGUF for methods redrafter and eagle and for auto (default: the head pyspec "
                          "train-head wrote for this target, if any)")
    gen.add_argument("--no-head", action="store_true", help="no draft head, not even the one known for the target")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file with the prompt text ('-' for stdin)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    d = GenerationConfig()
    gen.add_argument("--method", choices=list(METHODS), default="auto",
                     help="decoding method: auto (default: per step what pays on this machine, from the cost "
                          "curves of `pyspec calibrate`), chain (draft model chain), tree (draft model token "
                          "tree), beam (draft model beam search), lookup (prompt lookup + phrase pool, no draft "
                          "model), ouroboros (draft model + phrase pool), redrafter (beam search over a draft "
                          "head, --head), eagle (EAGLE-2 tree over a draft head, --head) or none (plain decoding)")
    gen.add_argument("--auto-max-depth", type=int, default=d.auto_max_depth,
                     help=f"auto: longest lookup/pool path considered (default {d.auto_max_depth})")
    gen.add_argument("--auto-max-nodes", type=int, default=d.auto_max_nodes,
                     help=f"auto: lookup/pool nodes considered per step (default {d.auto_max_nodes})")
    gen.add_argument("--auto-max-gamma", type=int, default=d.auto_max_gamma,
                     help=f"auto: longest draft-model chain considered (default {d.auto_max_gamma})")
    gen.add_argument("--auto-no-draft-model", action="store_true",
                     help="auto: never draft with the draft model (lookup, pool and plain decoding only)")
    gen.add_argument("--auto-no-head", action="store_true", help="auto: never draft with the draft head (--head)")
    gen.add_argument("--auto-head-tree-nodes", type=int, default=d.auto_head_tree_nodes,
                     help="auto: where a head chain pays, draft a head tree of up to this many nodes, pruned to what "
                          f"pays (0: chains only; default {d.auto_head_tree_nodes})")
    gen.add_argument("--tree-nodes", type=int, default=d.tree_nodes, help=f"tree, eagle: node budget (default {d.tree_nodes})")
    gen.add_argument("--tree-depth", type=int, default=d.tree_depth, help=f"tree, eagle: longest path (default {d.tree_depth})")
    gen.add_argument("--tree-branching", type=int, default=d.tree_branching,
                     help=f"tree, eagle: children per expanded node (default {d.tree_branching})")
    gen.add_argument("--tree-expand", type=int, default=d.tree_expand,
                     help=f"tree, eagle: frontier nodes expanded per draft (or head) step (default {d.tree_expand})")
    gen.add_argument("--beams", type=int, default=d.beams,
                     help=f"beam, redrafter: number of beams K (default {d.beams})")
    gen.add_argument("--beam-length", type=int, default=d.beam_length,
                     help=f"beam, redrafter: beam length L (default {d.beam_length})")
    gen.add_argument("--acceptance", choices=["exact", "typical"], default=d.acceptance,
                     help="sampled verification: exact (default) or typical (Medusa; LOSSY, not the target's distribution)")
    gen.add_argument("--typical-epsilon", type=float, default=d.typical_epsilon)
    gen.add_argument("--typical-delta", type=float, default=d.typical_delta)
    gen.add_argument("--lookup-ngram-max", type=int, default=d.lookup_ngram_max,
                     help=f"lookup, auto: longest n-gram matched against earlier text (default {d.lookup_ngram_max})")
    gen.add_argument("--lookup-ngram-min", type=int, default=d.lookup_ngram_min,
                     help=f"lookup, auto: shortest n-gram tried before proposing nothing (default {d.lookup_ngram_min})")
    gen.add_argument("--grammar", metavar="FILE", help="a GBNF grammar file the output must follow (start rule root)")
    gen.add_argument("--json-schema", metavar="FILE", help="a JSON schema file the output must follow")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, tokens, finish_reason, stats")
    add_generation_options(gen)
    add_engine_options(gen)
    add_rpc_option(gen)
    add_ngram_option(gen)
    add_stats_option(gen)
    gen.set_defaults(handler=_cmd_generate)
