#!/usr/bin/env python3
"""A BPE vocabulary for KJV (SentencePiece, Debian's python3-sentencepiece),
and KJV as an anvil token file (ANVILTOK, docs/train.md) in it.

ZAYA1's zaya-small is specified with "a vocabulary of a few thousand": with
bytes, the space alone is 19% of KJV's tokens, three times an expert's share
of 16, and a router that sends it to one expert keeps that expert at 3x
whatever the biases do (docs/zaya1.md, "Balancing"). Newlines are kept as a
piece of their own (SentencePiece trains on lines). Writes OUT.model,
OUT.vocab and OUT.tok, each via a temporary file and a rename. Usage:
  bench/kjv_bpe.py [--text data/kjv.txt] [--vocab 4096] [--out data/kjv-bpe4k]
  bench/kjv_bpe.py --decode OUT.model ID...   (ids -> text, for samples)
"""
import argparse, collections, os, struct, sys, tempfile

import sentencepiece as spm

NEWLINE = "<nl>"


def write_atomic(path, data):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def train(text, vocab, out):
    lines = open(text, encoding="utf-8").read().split("\n")
    d = os.path.dirname(os.path.abspath(out))
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        prefix = os.path.join(tmp, "m")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([l for l in lines if l]), model_prefix=prefix, vocab_size=vocab,
            model_type="bpe", character_coverage=1.0, user_defined_symbols=[NEWLINE],
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            bos_id=-1, eos_id=-1, minloglevel=2)
        for ext in ("model", "vocab"):
            write_atomic(f"{out}.{ext}", open(f"{prefix}.{ext}", "rb").read())
    sp = spm.SentencePieceProcessor(model_file=f"{out}.model")
    nl = sp.piece_to_id(NEWLINE)
    ids = []
    for i, line in enumerate(lines):
        ids += sp.encode(line)
        if i + 1 < len(lines):
            ids.append(nl)
    head = b"ANVILTOK" + struct.pack("<IIQQ", 1, 2, sp.get_piece_size(), len(ids)) + bytes(32)
    write_atomic(f"{out}.tok", head + struct.pack(f"<{len(ids)}H", *ids))
    top = collections.Counter(ids).most_common(5)
    print(f"{out}.tok: {len(ids)} tokens, vocabulary {sp.get_piece_size()}, "
          f"{os.path.getsize(text) / len(ids):.2f} bytes per token; most frequent: " +
          ", ".join(f"{sp.id_to_piece(t)!r} {c / len(ids):.1%}" for t, c in top))


def decode(model, ids):
    sp = spm.SentencePieceProcessor(model_file=model)
    nl = sp.piece_to_id(NEWLINE)
    out, run = [], []
    for t in ids:
        if t == nl:
            out.append(sp.decode(run))
            run = []
        else:
            run.append(t)
    out.append(sp.decode(run))
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default="data/kjv.txt")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--out", default="data/kjv-bpe4k")
    ap.add_argument("--decode", metavar="MODEL")
    ap.add_argument("ids", nargs="*", type=int)
    a = ap.parse_args()
    if a.decode:
        decode(a.decode, a.ids)
        return
    if not os.path.isfile(a.text):
        sys.exit(f"--text {a.text}: no such file (scripts/kjv-text.sh writes data/kjv.txt)")
    if not 256 <= a.vocab <= 65535:
        sys.exit(f"--vocab {a.vocab}: expected 256..65535 (uint16 token file)")
    train(a.text, a.vocab, a.out)


if __name__ == "__main__":
    main()
