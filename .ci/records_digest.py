"""sha256 of a results folder's records, independent of the code's identity: every samples.jsonl
line with its run hash left out (the hash covers the library releases), sorted. Two environments
that give the same digest wrote the same prompts, outputs and scores.

    python .ci/records_digest.py RESULTS_DIR
"""

import hashlib
import json
import sys
from pathlib import Path

lines = []
for path in sorted(Path(sys.argv[1]).glob("*/samples.jsonl")):
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        record.pop("run", None)
        lines.append(json.dumps(record, sort_keys=True))
if not lines:
    sys.exit(f"no records under {sys.argv[1]}")
print(f"{hashlib.sha256(chr(10).join(sorted(lines)).encode()).hexdigest()} {len(lines)} records")
