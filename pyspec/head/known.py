"""The draft heads known for each target: `pyspec train-head` remembers the head it writes for
its target, and an Engine made without `head=` loads the head known for its target, so that
method "auto" weighs it in `pyspec generate`, `pyspec serve` and the library without a flag.

The index is one JSON file, `known.json` in $PYSPEC_HEADS (default $PYSPEC_CACHE/heads, i.e.
~/.cache/pyspec/heads): {target key: absolute head path}. A target's key is its file's name and
size, so the same GGUF under another directory (a copy, the registry's cache) finds its head too.
The heads stay where they were written; a remembered head that has since been deleted is skipped.
No torch here: the serving process reads the index.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from ..fetch import Cache

log = logging.getLogger(__name__)

HEADS_ENV = "PYSPEC_HEADS"
INDEX_NAME = "known.json"


def heads_dir() -> Path:
    """Where the index lives: $PYSPEC_HEADS, else $PYSPEC_CACHE/heads."""
    root = os.environ.get(HEADS_ENV)
    return Path(root).expanduser() if root else Cache.default().root / "heads"


def target_key(target_path: str | os.PathLike[str]) -> str:
    path = Path(target_path)
    return f"{path.name}:{path.stat().st_size}"


def _read_index() -> dict[str, str]:
    path = heads_dir() / INDEX_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring the known-heads index %s: %s", path, exc)
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_index(index: dict[str, str]) -> None:
    folder = heads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".known-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1, sort_keys=True)
        os.replace(tmp, folder / INDEX_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def known_head(target_path: str | os.PathLike[str]) -> Path | None:
    """The head remembered for this target file, if it still exists."""
    head = _read_index().get(target_key(target_path))
    if head is None:
        return None
    if not os.path.isfile(head):
        log.info("the draft head remembered for %s is gone: %s", Path(target_path).name, head)
        return None
    return Path(head)


def remember_head(target_path: str | os.PathLike[str], head_path: str | os.PathLike[str]) -> None:
    """Makes `head_path` the head an Engine of this target loads by default."""
    index = _read_index()
    index[target_key(target_path)] = str(Path(head_path).resolve())
    _write_index(index)
