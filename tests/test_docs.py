"""The front door: a README short enough to be a landing page, with no dated changelog and no issue numbers, and
every page of the docs site reachable from its navigation."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\bissues? \d+", text, re.IGNORECASE)
    assert not re.search(r"^> .*\b20\d\d-\d\d-\d\d", text, re.MULTILINE)  # no dated notes opening sections


def test_every_docs_page_is_in_the_navigation():
    def pages(entries) -> set[str]:
        found = set()
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    on_disk = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert pages(config["nav"]) == on_disk
