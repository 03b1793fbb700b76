"""Writing settings changed at runtime (UPDATE_BROKER_CONFIG) back into the broker's config file.

Apache's ``Configuration.persist`` rewrites the whole file with every setting of the broker. We
change only the lines of the keys that changed, in the file's own format, and append the keys it
did not have: the operator's comments, layout and the Apache keys we ignore survive, and the file
still says only what the operator (or an update) set. Like Apache's ``MixAll.string2File`` the old
file is kept as ``<file>.bak`` and the new one replaces it atomically. The result is read back
before it replaces the file, so an update can never leave a file the broker would refuse at start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path

from broker.remoting import java_properties
from broker.server.settings.declared import SETTING_FIELDS
from broker.server.settings.loading import PROPERTIES, detect_format, settings_from_mapping

_TABLE_HEADER = re.compile(r"^\s*\[")
_BROKER_HEADER = re.compile(r"^\s*\[\s*broker\s*\]\s*(#.*)?$")


def _spellings(key: str) -> set[str]:
    return {key, SETTING_FIELDS[key].name}


def _toml_value(key: str, text: str) -> str:
    kind = SETTING_FIELDS[key].type
    if kind in ("int", int):
        return str(int(text))
    if kind in ("bool", bool):
        return text.lower()
    return json.dumps(text, ensure_ascii=False)


def _update_properties(text: str, updates: dict[str, str]) -> str:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    replaced: dict[int, str | None] = {}  # 0-based line → new text (None: drop the line)
    done = set()
    for entry in java_properties.parse_entries(text):
        for key, value in updates.items():
            if entry.key in _spellings(key):
                replaced[entry.first_line - 1] = f"{entry.key}={java_properties.escape(value)}"
                for extra in range(entry.first_line, entry.last_line):  # continuation lines
                    replaced[extra] = None
                done.add(key)
    out = [replaced.get(i, line) for i, line in enumerate(lines)]
    out = [line for line in out if line is not None]
    while out and out[-1] == "":
        out.pop()
    out += [f"{key}={java_properties.escape(value)}" for key, value in updates.items() if key not in done]
    return "\n".join(out) + "\n"


def _update_toml(text: str, updates: dict[str, str]) -> str:
    lines = text.splitlines()
    has_broker_table = any(_BROKER_HEADER.match(line) for line in lines)
    in_table = not has_broker_table  # a flat file: the settings are the root table
    table_end = None
    done = set()
    for i, line in enumerate(lines):
        if _TABLE_HEADER.match(line):
            if in_table and table_end is None:
                table_end = i
            in_table = bool(_BROKER_HEADER.match(line))
            if in_table:
                table_end = None
            continue
        if not in_table:
            continue
        for key, value in updates.items():
            names = "|".join(re.escape(n) for n in _spellings(key))
            if re.match(rf'^\s*(?:"?)({names})(?:"?)\s*=', line):
                name = re.match(rf'^\s*"?({names})', line).group(1)
                lines[i] = f"{name} = {_toml_value(key, value)}"
                done.add(key)
    missing = [f"{key} = {_toml_value(key, value)}" for key, value in updates.items() if key not in done]
    if table_end is None:
        table_end = len(lines)
    while table_end and not lines[table_end - 1].strip():  # keep the blank lines before the next table
        table_end -= 1
    lines[table_end:table_end] = missing
    return "\n".join(lines) + "\n"


def persist_updates(path: str | os.PathLike, updates: dict[str, str]) -> None:
    """Write ``updates`` (broker.conf key → value text, already checked) into the config file."""
    p = Path(path)
    raw = p.read_bytes()
    is_properties = detect_format(p, raw.decode(java_properties.FILE_ENCODING)) == PROPERTIES
    if is_properties:
        new = _update_properties(raw.decode(java_properties.FILE_ENCODING), updates)
        data = new.encode(java_properties.FILE_ENCODING)
    else:
        new = _update_toml(raw.decode("utf-8"), updates)
        data = new.encode("utf-8")
    if is_properties:
        check = java_properties.loads(new)
    else:
        parsed = tomllib.loads(new)
        check = parsed.get("broker", parsed)
    settings_from_mapping(check, str(p))  # never leave a file the broker would refuse at start
    tmp = p.with_name(p.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        shutil.copy2(p, p.with_name(p.name + ".bak"))
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
