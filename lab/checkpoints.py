"""Checkpoints of long measurements, so that one killed part way (a session ends, a machine goes) resumes.

A checkpoint is a JSONL file: a header line (everything the results depend on: hardware, settings, the draft's and
policies' digests), then one line per finished unit (a prompt, a load) in the order the units are measured. Read
back with the same header it gives the finished units' results; written with another header it is refused, naming
what differs, never mixed in; a last line cut short by a kill is dropped (that unit is measured again).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Checkpoint:
    """``path``'s finished units, each a line ``{unit_key: unit, payload_key: result}``, checked against ``header``
    and against ``units`` (the order in which they are measured)."""

    path: Path
    header: dict
    units: Sequence[str]
    unit_key: str
    payload_key: str

    def done(self) -> list:
        """The results of the units finished so far, in order (none when the file does not exist yet)."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        if not lines:
            return []
        saved = json.loads(lines[0])["header"]
        differs = [key for key in self.header if saved.get(key) != self.header[key]]
        if differs:
            raise ValueError(
                f"{self.path} was measured with other {', '.join(differs)} "
                f"({'; '.join(f'{key}: {saved.get(key)!r} there, {self.header[key]!r} here' for key in differs)}); "
                "delete it to measure afresh, or resume where it was made"
            )
        done = []
        for number, line in enumerate(lines[1:], start=2):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                if number < len(lines):
                    raise ValueError(f"{self.path}: line {number} is not JSON") from None
                self.path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")  # cut short by a kill: measured again
                break
            expected = self.units[len(done)] if len(done) < len(self.units) else None
            if entry[self.unit_key] != expected:
                raise ValueError(f"{self.path}: line {number} holds {self.unit_key} {entry[self.unit_key]!r}, expected {expected!r}")
            done.append(entry[self.payload_key])
        return done

    def add(self, unit: str, result) -> None:
        """Append one finished unit's result (the header first, when the file is new)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", encoding="utf-8") as file:
            file.write((json.dumps({"header": self.header}) + "\n" if new else "") + json.dumps({self.unit_key: unit, self.payload_key: result}) + "\n")
