"""json_keys.py KEY.PATH ... < json: fails unless every dotted key exists (rows[0] for arrays).
JSON Lines (run and validate --json): the keys of the last line, the summary."""
import json
import sys

text = sys.stdin.read()
lines = text.splitlines()
doc = json.loads(lines[-1]) if len(lines) > 1 and lines[0].startswith("{\"type\"") else json.loads(text)
for path in sys.argv[1:]:
    node = doc
    for part in path.split("."):
        if isinstance(node, list):
            node = node[0]
        if not isinstance(node, dict) or part not in node:
            sys.exit(f"missing key {path} (at {part})")
        node = node[part]
print("keys ok:", ", ".join(sys.argv[1:]))
