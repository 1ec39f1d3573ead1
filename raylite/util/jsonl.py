"""JSON-lines result files (train runs and tune trials write one JSON object per report)."""
from __future__ import annotations

import json
import os


def read_json_lines(path: str | os.PathLike) -> list[dict]:
    """Every complete record in the file; [] when it does not exist. A line cut short by a
    killed process (the last one) is skipped rather than failing the whole read."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return records
