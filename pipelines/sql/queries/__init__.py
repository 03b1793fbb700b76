"""Ready-made queries: the ``.sql`` files of this directory, listed by ``rocketlake sql --list-queries``.

Each file is plain SQL people can copy and adapt; its header comment says what it answers, which
tables it needs, on which engines it runs, and declares its parameters
(``-- @param NAME = DEFAULT | description``, filled by ``--param NAME=VALUE``; see
:mod:`pipelines.sql.statements`). ``rocketlake sql --lake LAKE --saved NAME`` runs one by name.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.sql.statements import Param, declared_params

QUERIES_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SavedQuery:
    name: str
    path: Path
    title: str              # first line of the header comment
    tables: list[str]       # "-- Tables: a, b" line
    engines: str            # "-- Engines: ..." line
    params: list[Param]

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def _header_field(text: str, field: str) -> str:
    m = re.search(rf"^--\s*{field}:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else ""


def load(path: Path) -> SavedQuery:
    text = path.read_text(encoding="utf-8")
    first = next((line.lstrip("- ").strip() for line in text.splitlines() if line.startswith("--")
                  and line.lstrip("- ").strip()), "")
    tables = [t.strip() for t in _header_field(text, "Tables").split(",") if t.strip()]
    return SavedQuery(path.stem, path, first, tables, _header_field(text, "Engines"), declared_params(text))


def list_queries() -> list[SavedQuery]:
    return [load(p) for p in sorted(QUERIES_DIR.glob("*.sql"))]


def find_query(name: str) -> SavedQuery:
    """The query called ``name`` (file stem, ``.sql`` optional); KeyError with close names if none."""
    stem = name.removesuffix(".sql")
    path = QUERIES_DIR / f"{stem}.sql"
    if path.is_file() and path.parent == QUERIES_DIR:
        return load(path)
    names = [p.stem for p in sorted(QUERIES_DIR.glob("*.sql"))]
    close = difflib.get_close_matches(stem, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; there are: {', '.join(names)}"
    raise KeyError(f"no ready-made query {name!r}{hint}")


def _shown(path: Path) -> str:
    """The path as a user would type it here: relative when under the working directory."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def describe(queries: list[SavedQuery]) -> str:
    """The ``--list-queries`` text: name, title, tables, engines and parameters of each query."""
    lines = []
    for q in queries:
        lines.append(f"{q.name}  —  {q.title}")
        lines.append(f"    tables: {', '.join(q.tables) or '-'}; engines: {q.engines or '-'}")
        for p in q.params:
            default = f" (default {p.default})" if p.default is not None else " (required)"
            lines.append(f"    --param {p.name}=…{default}  {p.description}".rstrip())
        lines.append(f"    {_shown(q.path)}")
    return "\n".join(lines)
