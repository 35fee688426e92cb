"""A SentencePiece run's tokenizer.json, read by transformers' AutoTokenizer.

    tokenizer_json_check.py --anvil BIN --work DIR

anvil trains a BPE tokenizer, tokenizes text with it (prose, C++ source,
unseen scripts and emoji that go through byte fallback, blank lines, tabs),
trains a small model on the ids and exports it; transformers' AutoTokenizer
loads the export's tokenizer.json and must give the same ids as anvil's
token file and decode them back to the same text.
"""
import os
import struct
import sys

from transformers import AutoTokenizer

from interop_common import ROOT, fresh, parser, run

args = parser(__doc__).parse_args()
fresh(args.work)
w = lambda name: os.path.join(args.work, name)
text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
text += open(os.path.join(ROOT, "src/anvil/ckpt/hf.cpp"), encoding="utf-8").read()
text += "\n\n\tunseen: ünïcödé — “quotes” 日本語 🎉 Ωmega\r\n  two spaces, trailing   \n"
open(w("text.txt"), "w", encoding="utf-8").write(text)
run([args.anvil, "data", "tokenizer", "train", "--text", os.path.join(ROOT, "README.md"),
     "--vocab", "700", "--out", w("tk")])
run([args.anvil, "data", "tokenize", "--text", w("text.txt"), "--tokenizer", w("tk.model"),
     "--out", w("text.tok"), "--verify"])
run([args.anvil, "train", "--config", os.path.join(ROOT, "tests/configs/gpt2-tiny.json"),
     "--set", "vocab_size=700", "-B", "2", "-T", "32", "--steps", "2", "--peak-gflops", "1",
     "--data", w("text.tok"), "--out", w("run")])
run([args.anvil, "ckpt", "export", "--checkpoint", w("run"), "--out", w("hf")])
raw = open(w("text.tok"), "rb").read()
count = struct.unpack_from("<Q", raw, 24)[0]
anvil = list(struct.unpack_from(f"<{count}H", raw, 64))
tok = AutoTokenizer.from_pretrained(w("hf"))
ids = tok.encode(text, add_special_tokens=False)
if ids != anvil:
    i = next((k for k, (a, b) in enumerate(zip(ids, anvil)) if a != b), min(len(ids), len(anvil)))
    sys.exit(f"FAILED: ids differ at {i}: transformers {ids[i-3:i+3]} anvil {anvil[i-3:i+3]}")
back = tok.decode(ids, clean_up_tokenization_spaces=False)
if back != text:
    sys.exit("FAILED: transformers' decode of the ids is not the text")
print(f"tokenizer.json: {len(ids)} ids equal to anvil's over {len(text.encode())} bytes, "
      f"decoded back exactly: ok")
