"""What the interop checks (hf_interop, lm_eval_parity, tokenizer_json_check,
tensorboard_check) share: the repository root, running anvil, and the
--anvil / --work arguments with a fresh work directory."""
import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd):
    """Runs a command; on failure exits naming it, with its output."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAILED ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def parser(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--anvil", required=True, help="the anvil binary")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    return ap


def fresh(work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
