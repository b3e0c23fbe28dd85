"""Writes docs/cli.md, the command-line reference, from the argparse parser of `pyspec`
(pyspec.cli.main.build_parser), so that the reference cannot drift from the code.

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check    # exit 1 if docs/cli.md is out of date

tests/test_cli_docs.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = 100  # usage lines are wrapped at a fixed width, whatever the terminal

HEADER = """# Command-line reference

Generated from the code by `python scripts/gen_cli_docs.py`; do not edit by hand
(`tests/test_cli_docs.py` fails when this page and the parser disagree). The user guide
([guide.md](guide.md)) shows the commands at work; the generation defaults come from
`GenerationConfig` ([python-api.md](python-api.md)).

Every command takes the global `-v` / `--verbose` before its name (`pyspec -v generate ...`: log
more; `-vv`: llama.cpp's debug log too). Model arguments take a GGUF path or a registry name
(`pyspec models list`).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        text = text % params
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += (" " if text else "") + "(one of: " + ", ".join(str(c) for c in action.choices) + ")"
    return _cell(text)


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if action.default else "off"
    if action.required:
        return "required"
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    if isinstance(action, argparse._CountAction):
        return str(action.default)
    return f"`{_cell(str(action.default))}`"


def _name(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return f"`{names} {metavar}`"


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    return parser.format_usage().strip()


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _command(lines: list[str], name: str, parser: argparse.ArgumentParser, summary: str, level: int) -> None:
    lines += ["", "#" * level + f" `{name}`", ""]
    if summary:
        lines += [_cell(summary[0].upper() + summary[1:]) + ".", ""]
    if parser.description and parser.description != summary:
        lines += [_cell(parser.description), ""]
    lines += ["```", _usage(parser), "```"]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        lines += ["", "| option | default | meaning |", "|---|---|---|"]
        lines += [f"| {_name(a)} | {_default(a)} | {_help(a)} |" for a in rows]
    sub = _subparsers(parser)
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for child, child_parser in sub.choices.items():
            _command(lines, f"{name} {child}", child_parser, helps.get(child, ""), level + 1)


def render() -> str:
    from pyspec.cli.main import build_parser

    parser = build_parser()
    sub = _subparsers(parser)
    assert sub is not None
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    lines = HEADER.rstrip("\n").split("\n")
    lines += ["", "| command | what it does |", "|---|---|"]
    lines += [f"| [`pyspec {name}`](#pyspec-{name.replace(' ', '-')}) | {_cell(helps.get(name, ''))} |"
              for name in sub.choices]
    for name, child in sub.choices.items():
        _command(lines, f"pyspec {name}", child, helps.get(name, ""), 2)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md differs from the parser")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
