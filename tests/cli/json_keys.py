"""json_keys.py KEY.PATH ... < json: fails unless every dotted key exists (rows[0] for arrays)."""
import json
import sys

doc = json.load(sys.stdin)
for path in sys.argv[1:]:
    node = doc
    for part in path.split("."):
        if isinstance(node, list):
            node = node[0]
        if not isinstance(node, dict) or part not in node:
            sys.exit(f"missing key {path} (at {part})")
        node = node[part]
print("keys ok:", ", ".join(sys.argv[1:]))
