"""The converted-model cache: a folder is made once, whole, even by two processes at once."""

from __future__ import annotations

import subprocess
import sys

WRITER = """
import sys, time
from pathlib import Path
from adaptive.models import write_once

def write(staging: Path) -> None:
    staging.mkdir(parents=True)
    time.sleep(1.0)  # both are writing at the same time
    (staging / "weights").write_text(sys.argv[2])

print(write_once(Path(sys.argv[1]), write))
"""


def test_two_processes_making_one_folder_at_once_both_get_it(tmp_path):
    """Two background jobs started together on a fresh machine both convert the target: the second to
    finish keeps the first's folder (renaming onto it once crashed) and leaves no staging folder."""
    folder = tmp_path / "models" / "target"
    jobs = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in "ab"]
    results = [job.communicate(timeout=120) + (job.returncode,) for job in jobs]
    assert [code for _, _, code in results] == [0, 0], [err[-500:] for _, err, _ in results]
    assert {out.strip() for out, _, _ in results} == {str(folder)}
    assert [p.name for p in folder.parent.iterdir()] == ["target"]
    assert (folder / "weights").read_text() in ("a", "b")
