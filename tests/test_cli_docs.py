"""docs/cli.md is generated from the argparse parser (scripts/gen_cli_docs.py); this fails when
a flag, default or help text changes without the page being regenerated."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_the_parser() -> None:
    generated = load_generator().render()
    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == generated, "docs/cli.md is out of date: run python scripts/gen_cli_docs.py"


def test_cli_reference_covers_every_command() -> None:
    from pyspec.cli.main import COMMANDS

    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    parser_names = [m.__name__.rsplit(".", 1)[-1].replace("_", "-") for m in COMMANDS]
    for name in parser_names:
        assert f"## `pyspec {name}`" in written, name
