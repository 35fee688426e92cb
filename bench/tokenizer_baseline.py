#!/usr/bin/env python3
"""The Python SentencePiece baseline for bench/tokenizer.sh: encodes TEXT with
MODEL the way anvil does (lines, newline piece between them) using the
binding's own threads, checks the ids equal anvil's token file, prints
'python_mb_per_s X'. Usage: tokenizer_baseline.py MODEL TEXT ANVIL_TOK THREADS"""
import struct, sys, time

import sentencepiece as spm

model, text_path, tok_path, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sp = spm.SentencePieceProcessor(model_file=model)
nl = sp.piece_to_id("<nl>")
text = open(text_path, encoding="utf-8").read()
t0 = time.perf_counter()
lines = text.split("\n")
encoded = sp.encode(lines, num_threads=threads)
ids = []
for i, line in enumerate(encoded):
    ids += line
    if i + 1 < len(encoded):
        ids.append(nl)
dt = time.perf_counter() - t0
raw = open(tok_path, "rb").read()
width = struct.unpack_from("<I", raw, 12)[0]
count = struct.unpack_from("<Q", raw, 24)[0]
anvil = struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", raw, 64)
if list(anvil) != ids:
    sys.exit(f"ids differ from anvil's ({len(ids)} vs {count} tokens)")
print(f"python_mb_per_s {len(text.encode()) / dt / 1e6:.3f}")
