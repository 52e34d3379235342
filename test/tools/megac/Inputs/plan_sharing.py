"""Checks that a plan stores each distinct instruction once.

Reads `megac inspect --json` of one plan on stdin. Instructions with the
same contents (everything but their index and the group ranks resolved for
the rank printing them) should be one table in the file, so the plan's
distinct_instructions must equal the number of different contents. Prints
"shared" on success and the counts either way.
"""
import json
import sys

plan = json.load(sys.stdin)
contents = set()
for rank in plan["ranks"]:
    for instr in rank["instructions"]:
        key = {k: v for k, v in instr.items() if k not in ("index", "group")}
        contents.add(json.dumps(key, sort_keys=True))
total = sum(len(rank["instructions"]) for rank in plan["ranks"])
print(f"{total} instructions, {len(contents)} different contents, "
      f"{plan['distinct_instructions']} tables")
print("shared" if len(contents) == plan["distinct_instructions"]
      and plan["instructions"] == total else "NOT SHARED")
