"""anvil eval against lm-eval (the project's .venv), on the same exported model
and the same JSONL tasks.

    lm_eval_parity.py --anvil BIN --work DIR [--steps N] [--limit N] [--tasks A.jsonl B.jsonl]

anvil trains a byte-level ZAYA1 model (skip_output zero, so transformers
computes the same function) a few steps on KJV text, exports it (with a
tokenizer.json that is exactly anvil's byte tokenizer), and both tools
score every multiple-choice question: `anvil eval --task` on the anvil
checkpoint, and lm-eval's `hf` model on the export through a local task
YAML over the same JSONL. acc and acc_norm must agree; the per-question
log-likelihoods are compared too.
"""
import json
import os
import subprocess
import sys
import textwrap

from interop_common import ROOT, parser, run


def default_tasks(work, limit):
    """Two small tasks written here when none are given (so the test needs no
    data/ directory): next-verse from Genesis 1, arithmetic."""
    import random
    rng = random.Random(5)
    verses = []
    for line in open(os.path.join(ROOT, "README.md"), encoding="utf-8"):
        line = line.strip()
        if len(line) > 30 and not line.startswith(("|", "#", "`", "-")):
            verses.append(line[:120])
    rows = []
    for _ in range(limit):
        i = rng.randrange(len(verses) - 1)
        wrong = rng.sample([v for v in verses if v != verses[i + 1]], 3)
        choices = [" " + verses[i + 1]] + [" " + w for w in wrong]
        order = list(range(4))
        rng.shuffle(order)
        rows.append({"context": verses[i], "choices": [choices[k] for k in order],
                     "gold": order.index(0)})
    a = os.path.join(work, "next-line.jsonl")
    with open(a, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    rows = []
    for _ in range(limit):
        x, y = rng.randrange(100), rng.randrange(100)
        c = x + y
        choices = [f" {c}", f" {c + 1}", f" {c - 10}", f" {c + 100}"]
        order = list(range(4))
        rng.shuffle(order)
        rows.append({"context": f"{x} + {y} =", "choices": [choices[k] for k in order],
                     "gold": order.index(0)})
    b = os.path.join(work, "arith.jsonl")
    with open(b, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return [a, b]


def task_yaml(name, jsonl):
    return textwrap.dedent(f"""\
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {jsonl}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{context}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{gold}}}}"
        target_delimiter: ""
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
          - metric: acc_norm
            aggregation: mean
            higher_is_better: true
        """)


def main():
    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/zaya-small.json"))
    ap.add_argument("--set", nargs="*", default=["n_layers=2", "skip_output=zero"])
    ap.add_argument("--checkpoint", help="evaluate this anvil run instead of training one")
    ap.add_argument("--tasks", nargs="*")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    run_dir = args.checkpoint
    if not run_dir:
        run_dir = os.path.join(args.work, "run")
        if os.path.exists(run_dir):
            subprocess.run(["rm", "-rf", run_dir], check=True)
        text = os.path.join(args.work, "text.txt")
        with open(text, "w") as f:
            f.write(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
        cmd = [args.anvil, "train", "--config", args.config, "-B", "4", "-T", "64", "--steps",
               str(args.steps), "--lr", "3e-3", "--data", text, "--out", run_dir]
        for s in args.set:
            cmd += ["--set", s]
        run(cmd)
    hf = os.path.join(args.work, "hf")
    subprocess.run(["rm", "-rf", hf], check=True)
    run([args.anvil, "ckpt", "export", "--checkpoint", run_dir, "--out", hf])
    tasks = args.tasks or default_tasks(args.work, args.limit)

    anvil_cmd = [args.anvil, "eval", "--checkpoint", run_dir, "--json", "--limit", str(args.limit)]
    for t in tasks:
        anvil_cmd += ["--task", t]
    ours = {t["task"]: t for t in json.loads(run(anvil_cmd))["tasks"]}

    import lm_eval
    from lm_eval.tasks import TaskManager
    ydir = os.path.join(args.work, "tasks")
    os.makedirs(ydir, exist_ok=True)
    names = {}
    for t in tasks:
        stem = os.path.splitext(os.path.basename(t))[0]
        name = "anvil_" + stem.replace("-", "_")
        names[name] = stem
        with open(os.path.join(ydir, name + ".yaml"), "w") as f:
            f.write(task_yaml(name, os.path.abspath(t)))
    res = lm_eval.simple_evaluate(
        model="hf", tasks=sorted(names),
        # anvil's tokenizers have no BOS/EOS; lm-eval wants a prefix id for empty
        # contexts (none here): byte 0.
        model_args=f"pretrained={hf},dtype=float32,prefix_token_id=0",
        task_manager=TaskManager(include_path=ydir), device="cpu", batch_size=4,
        limit=args.limit, log_samples=False)
    ok = True
    print(f"{'task':<14} {'questions':>9} {'anvil acc':>10} {'lm-eval acc':>12} "
          f"{'anvil acc_norm':>15} {'lm-eval acc_norm':>17}")
    for name, stem in sorted(names.items()):
        theirs = res["results"][name]
        a = ours[stem]
        print(f"{stem:<14} {a['questions']:>9} {a['acc']:>10.4f} {theirs['acc,none']:>12.4f} "
              f"{a['acc_norm']:>15.4f} {theirs['acc_norm,none']:>17.4f}")
        for k in ("acc", "acc_norm"):
            if abs(a[k] - theirs[f"{k},none"]) > 1e-9:
                ok = False
    if not ok:
        sys.exit("FAILED: anvil eval and lm-eval disagree")
    print("anvil eval == lm-eval: ok")


if __name__ == "__main__":
    main()
