#!/usr/bin/env bash
# Small multiple-choice tasks for `anvil eval` (and lm-eval, over the same
# JSONL) from the default corpus's texts, deterministic:
#   data/tasks/next-verse.jsonl  a KJV verse; pick the verse that follows
#                                among 4 (the others from elsewhere); verses
#                                of at most 100 characters
#   data/tasks/arith.jsonl       "a + b =" / "a - b =" / "a * b ="; pick the
#                                result among 4 near misses
# Each line: {"context": str, "choices": [str, ...], "gold": int}.
#   scripts/eval-tasks.sh [QUESTIONS=200]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
scripts/kjv-text.sh >/dev/null
mkdir -p data/tasks
/usr/bin/python3 - "$n" <<'PY'
import json, os, random, re, sys
n = int(sys.argv[1])
rng = random.Random(1234)

def write(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)

# KJV verses: "  N text" lines, continued on following indented-less lines.
verses, cur = [], None
for line in open("data/kjv.txt", encoding="utf-8"):
    m = re.match(r"^\s+(\d+) (.*)$", line.rstrip("\n"))
    if m:
        if cur: verses.append(cur)
        cur = m.group(2)
    elif line.strip() and cur is not None and not re.match(r"^\S.* \d+$", line.strip()):
        cur += " " + line.strip()
    else:
        if cur: verses.append(cur)
        cur = None
if cur: verses.append(cur)
# Verses of at most 100 characters, so a question fits a 256-token context
# even with byte-level tokens.
short = [i for i in range(len(verses) - 1) if len(verses[i]) <= 100 and len(verses[i + 1]) <= 100]
pool = [verses[i] for i in short]
rows = []
for _ in range(n):
    i = rng.choice(short)
    wrong = rng.sample([v for v in rng.sample(pool, 8) if v != verses[i + 1]], 3)
    choices = [" " + verses[i + 1]] + [" " + w for w in wrong]
    order = list(range(4)); rng.shuffle(order)
    rows.append({"context": verses[i], "choices": [choices[k] for k in order], "gold": order.index(0)})
write("data/tasks/next-verse.jsonl", rows)

rows = []
for _ in range(n):
    a, b, op = rng.randrange(1000), rng.randrange(1000), rng.randrange(3)
    if op == 2: a, b = a % 100, b % 100
    c = a + b if op == 0 else a - b if op == 1 else a * b
    ctx = f"{a} {'+-*'[op]} {b} ="
    wrong = set()
    while len(wrong) < 3:
        w = c + rng.choice([-100, -10, -2, -1, 1, 2, 10, 100])
        if w != c: wrong.add(w)
    choices = [f" {c}"] + [f" {w}" for w in sorted(wrong)]
    order = list(range(4)); rng.shuffle(order)
    rows.append({"context": ctx, "choices": [choices[k] for k in order], "gold": order.index(0)})
write("data/tasks/arith.jsonl", rows)
print(f"data/tasks/next-verse.jsonl, data/tasks/arith.jsonl: {n} questions each ({len(verses)} verses)")
PY
