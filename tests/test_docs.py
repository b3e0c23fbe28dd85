"""The user documentation (README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md) states current
facts: no development history, no paths outside the repository, links that resolve, and an API
page whose every name exists in the package."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import pyspec
from pyspec import calibration, engine

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md",
                REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md")])

ORDINALS = ("eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
            "twentieth|thirtieth|fortieth|fiftieth|(?:twenty|thirty|forty|fifty)-(?:first|second|third|fourth|"
            "fifth|sixth|seventh|eighth|ninth)")
HISTORY = {
    "a numbered work period": re.compile(rf"\b({ORDINALS})\b", re.I),
    "a work session": re.compile(r"\bsessions?\b", re.I),
    "an issue number": re.compile(r"\bissues?[ -]#?\d+|\bissues? \d+ and \d+|#\d{1,4}\b", re.I),
    "a path outside the repository": re.compile(r"(?<![\w.~])/(work|root|home|tmp/bash_jobs)/|\.\./shared\b"),
}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The text with fenced code blocks kept (commands are checked too) but URLs removed."""
    return re.sub(r"https?://\S+", "", text)


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_no_development_history(path: Path) -> None:
    assert path.exists(), f"{page_id(path)} is missing"
    text = prose(path.read_text(encoding="utf-8"))
    found = []
    for what, pattern in HISTORY.items():
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{page_id(path)}:{line}: {what}: {m.group(0)!r}")
    assert not found, "\n".join(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_relative_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif not resolved.is_relative_to(REPO):
            broken.append(f"{target}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {page_id(resolved)}")
    assert not broken, f"{page_id(path)}: " + "; ".join(broken)


def test_readme_is_for_a_first_hour() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert 150 <= text.count("\n") <= 250
    # The two commands CI runs (.ci/run) stay at the top of the install section.
    install = text[text.index("## Install"):]
    assert install.index("pip install . && pyspec demo") < install.index("\n## ", 3)
    assert 'pip install ".[test]" && pytest -q' in install[:install.index("\n## ", 3)]


def test_docs_index_lists_every_page() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert pages <= listed, f"docs/README.md does not list {sorted(pages - listed)}"


# --- docs/python-api.md against the code ---------------------------------------------------------

API_CLASSES = {
    "Engine": engine.Engine, "TextStream": engine.TextStream, "GenerationConfig": pyspec.GenerationConfig,
    "GenerationResult": pyspec.GenerationResult, "GenerationStats": pyspec.GenerationStats,
    "Trace": pyspec.Trace, "TokenLogprobs": pyspec.TokenLogprobs, "StreamChunk": pyspec.StreamChunk,
    "CostCurve": calibration.CostCurve, "CostModelState": calibration.CostModelState,
}


def engine_instance_attributes() -> set[str]:
    source = inspect.getsource(engine.Engine.__init__)
    return set(re.findall(r"self\.([a-z]\w*)\s*=", source))


def has_member(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return cls is engine.Engine and name in engine_instance_attributes()


def api_page() -> str:
    return (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")


def test_every_documented_name_exists() -> None:
    text = api_page()
    missing = []
    for cls_name, member in set(re.findall(r"`(\w+)\.(\w+)", text)):
        if cls_name in API_CLASSES and not has_member(API_CLASSES[cls_name], member):
            missing.append(f"{cls_name}.{member}")
    for name in set(re.findall(r"`pyspec\.(\w+)", text)):
        if not hasattr(pyspec, name) and not name.startswith(("online", "calibration", "config", "errors", "rpc")):
            missing.append(f"pyspec.{name}")
    assert not missing, f"docs/python-api.md documents names the package lacks: {sorted(missing)}"


def test_every_public_name_is_documented() -> None:
    text = api_page()
    undocumented = [name for name in pyspec.__all__ if f"`{name}" not in text]
    assert not undocumented, f"pyspec exports names docs/python-api.md does not mention: {undocumented}"


def test_every_engine_method_and_property_is_documented() -> None:
    text = api_page()
    public = {name for name, _ in inspect.getmembers(engine.Engine) if not name.startswith("_")}
    undocumented = sorted(name for name in public if f"Engine.{name}" not in text)
    assert not undocumented, f"Engine members docs/python-api.md does not mention: {undocumented}"


def test_every_result_field_is_documented() -> None:
    text = api_page()
    for cls in (pyspec.GenerationResult, pyspec.GenerationStats, pyspec.Trace, pyspec.TokenLogprobs,
                pyspec.StreamChunk):
        for field in dataclasses.fields(cls):
            assert f"`{field.name}`" in text or f"{cls.__name__}.{field.name}`" in text, \
                f"{cls.__name__}.{field.name} is not in docs/python-api.md"
