"""Hugging Face interop, checked by the real transformers (the project's .venv).

    hf_interop.py ARCH --anvil BIN --logits-dump BIN --work DIR     ARCH: zaya | gpt2 | llama

Export: anvil trains a few steps, `anvil ckpt export` writes the run, and
transformers' AutoModelForCausalLM.from_pretrained loads it with no missing,
unexpected or mismatched keys; its logits on a row of real text (tests/interop/text.txt,
a frozen copy of an old README) equal anvil's within 1e-4 relative (fp32), and greedy
generation gives the same 32 tokens. The bf16 export and a sharded export
(index.json) load too.
Import: a randomly initialised transformers model (every weight and buffer
perturbed, so a term mapped to the wrong place shows) is saved with
save_pretrained, `anvil ckpt import --hf` reads it, and anvil's logits and
greedy tokens equal transformers'; exporting the import gives back the same
tensors bit for bit; `anvil train --resume` continues from it.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from interop_common import ROOT, fresh, parser, run

TOL = 1e-4
# The text anvil trains ZAYA1 on and every model is compared on: a frozen
# copy of an old README, so editing the README cannot move the results.
TEXT = os.path.join(ROOT, "tests", "interop", "text.txt")
NEW_TOKENS = 32

# What anvil trains (config, overrides, batch, seq, data) per architecture.
TRAIN = {
    "zaya": ("configs/zaya-small.json", ["n_layers=2", "skip_output=zero"], 2, 64,
             TEXT),
    "gpt2": ("tests/configs/gpt2-tiny.json", [], 2, 32, None),
    "llama": ("tests/configs/llama-tiny.json", ["rotary_dim=0"], 2, 32, None),
}


def real_text_tokens(vocab, n):
    with open(TEXT, "rb") as f:
        data = f.read(4 * n)
    return [b % vocab for b in data[:n]]


def anvil_logits(args, ckpt, tokens):
    out = os.path.join(args.work, "logits.safetensors")
    run([args.logits_dump, ckpt, ",".join(map(str, tokens)), out])
    return load_file(out)["logits"].double()


def anvil_greedy(args, ckpt, prompt):
    out = run([args.anvil, "generate", "--checkpoint", ckpt, "--temperature", "0",
               "--max-new", str(NEW_TOKENS), "--prompt-tokens", ",".join(map(str, prompt))])
    return [int(t) for t in out.split()]


def hf_greedy(model, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=None)
    return out[0, len(prompt):].tolist()


def load_hf(path, dtype=torch.float32):
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=dtype)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"FAILED: transformers loading {path} reported {bad}")
    return model.eval()


def compare(what, a, b, tol=TOL):
    rel = (a - b).abs().max().item() / b.abs().max().item()
    print(f"  {what}: max |anvil - transformers| / max |transformers| = {rel:.2e} (tolerance {tol:g})")
    if not rel <= tol:
        sys.exit(f"FAILED: {what} differ by {rel:.2e} relative")


def compare_tokens(what, a, b):
    print(f"  {what} ({len(set(b))} distinct): anvil {a[:8]}..., transformers {b[:8]}...")
    if a != b:
        sys.exit(f"FAILED: {what}: greedy tokens differ\n  anvil        {a}\n  transformers {b}")


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double()


def check_export(args, arch):
    config, sets, B, T, data = TRAIN[arch]
    run_dir = os.path.join(args.work, "run")
    cmd = [args.anvil, "train", "--config", os.path.join(ROOT, config), "-B", str(B), "-T", str(T),
           "--steps", "30", "--lr", "3e-3", "--out", run_dir]
    for s in sets:
        cmd += ["--set", s]
    if data:
        cmd += ["--data", data]
    run(cmd)
    hf_dir = os.path.join(args.work, "hf")
    run([args.anvil, "ckpt", "export", "--hf", "--checkpoint", run_dir, "--out", hf_dir])
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    print(f"export: {cfg['architectures'][0]}, {len(load_file(os.path.join(hf_dir, 'model.safetensors')))} tensors")
    model = load_hf(hf_dir)
    V = cfg["vocab_size"]
    tokens = real_text_tokens(V, T)
    compare("logits (fp32 export)", anvil_logits(args, run_dir, tokens), hf_logits(model, tokens))
    prompt = tokens[:8]
    compare_tokens(f"greedy {NEW_TOKENS} tokens", anvil_greedy(args, run_dir, prompt),
                   hf_greedy(model, prompt))

    # bf16 export: loads, and every weight is the fp32 weight rounded to the
    # nearest bf16 (ties to even), as torch rounds it.
    bf_dir = os.path.join(args.work, "hf-bf16")
    run([args.anvil, "ckpt", "export", "--checkpoint", run_dir, "--out", bf_dir, "--dtype", "bfloat16"])
    bf = load_hf(bf_dir)
    assert next(bf.parameters()).dtype == torch.float32
    fp32_weights, bf16_weights = model.state_dict(), bf.state_dict()
    assert fp32_weights.keys() == bf16_weights.keys()
    for name, w in fp32_weights.items():
        rounded = w.to(torch.bfloat16).to(torch.float32)
        if not torch.equal(bf16_weights[name], rounded):
            sys.exit(f"FAILED: bf16 export: {name} is not the fp32 weight rounded to bf16")
    print(f"  bf16 export: {len(fp32_weights)} tensors, each the fp32 weight rounded to nearest even")
    if arch == "zaya":
        # ZAYA1's original alternating layout, as Zyphra's checkpoints have it
        # (anvil's own config key removed): imports to the same logits.
        orig = os.path.join(args.work, "original")
        run([args.anvil, "ckpt", "export", "--format", "original", "--checkpoint", run_dir,
             "--out", orig])
        cfg_path = os.path.join(orig, "config.json")
        ocfg = json.load(open(cfg_path))
        assert ocfg["num_hidden_layers"] == 2 * cfg["num_hidden_layers"], ocfg
        del ocfg["anvil"]
        json.dump(ocfg, open(cfg_path, "w"))
        back = os.path.join(args.work, "original-imported")
        run([args.anvil, "ckpt", "import", "--hf", orig, "--out", back])
        compare("logits (original layout, imported without anvil's config)",
                anvil_logits(args, back, tokens), hf_logits(model, tokens))
    # A sharded export: model-0000k-of-0000n.safetensors + model.safetensors.index.json.
    sh_dir = os.path.join(args.work, "hf-sharded")
    run([args.anvil, "ckpt", "export", "--checkpoint", run_dir, "--out", sh_dir,
         "--max-shard-size", "40KB"])
    files = sorted(f for f in os.listdir(sh_dir) if f.endswith(".safetensors"))
    assert len(files) > 1 and os.path.exists(os.path.join(sh_dir, "model.safetensors.index.json")), files
    whole, sharded = model.state_dict(), load_hf(sh_dir).state_dict()
    assert whole.keys() == sharded.keys() and all(torch.equal(whole[k], sharded[k]) for k in whole)
    print(f"  sharded export ({len(files)} files + index): the same weights bit for bit")


def random_hf_model(arch):
    torch.manual_seed(7)
    if arch == "zaya":
        from transformers import ZayaConfig, ZayaForCausalLM
        cfg = ZayaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
                         num_experts=4, router_hidden_size=16, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5}})
        model = ZayaForCausalLM(cfg)
    elif arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=67, n_positions=70, n_embd=48, n_layer=2, n_head=3,
                         bos_token_id=None, eos_token_id=None)
        model = GPT2LMHeadModel(cfg)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=61, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=70,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
        model = LlamaForCausalLM(cfg)
    # Every weight and buffer moved off its initial value (ones, zeros and a
    # zero key temperature would hide a term mapped to the wrong place).
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.dtype.is_floating_point and "inv_freq" not in name and not name.endswith("attn.bias"):
                if "balancing_biases" in name:
                    p.copy_(0.05 * torch.randn_like(p))
                elif p.dim() <= 1:
                    p.add_(0.2 * torch.randn_like(p))
                else:  # large enough that greedy decoding does not settle on one token
                    p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def check_import(args, arch):
    model = random_hf_model(arch)
    src = os.path.join(args.work, "hf-random")
    model.save_pretrained(src)
    run_dir = os.path.join(args.work, "imported")
    run([args.anvil, "ckpt", "import", "--hf", src, "--out", run_dir])
    V = model.config.vocab_size
    tokens = real_text_tokens(V, 48)
    print(f"import: {model.config.architectures or type(model).__name__}")
    compare("logits (imported)", anvil_logits(args, run_dir, tokens), hf_logits(model, tokens))
    prompt = tokens[:8]
    compare_tokens(f"greedy {NEW_TOKENS} tokens (imported)", anvil_greedy(args, run_dir, prompt),
                   hf_greedy(model, prompt))
    # Export of the import: the same tensors, bit for bit.
    back = os.path.join(args.work, "hf-back")
    run([args.anvil, "ckpt", "export", "--checkpoint", run_dir, "--out", back])
    a = load_file(os.path.join(src, "model.safetensors"))
    b = load_file(os.path.join(back, "model.safetensors"))
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(a) - tied == set(b), (set(a) ^ set(b))
    for k in b:
        assert torch.equal(a[k], b[k]), k
    print(f"  re-export: {len(b)} tensors identical to transformers' save_pretrained")
    # anvil train continues from the imported weights.
    cfg = os.path.join(run_dir, "model-config.json")
    out = run([args.anvil, "train", "--config", cfg, "--resume", run_dir, "-B", "1", "-T", "16",
               "--steps", "2", "--out", run_dir])
    assert "starting from the weights of" in out, out
    print("  anvil train --resume from the import: ran 2 steps")


def main():
    ap = parser(__doc__)
    ap.add_argument("arch", choices=sorted(TRAIN))
    ap.add_argument("--logits-dump", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    fresh(args.work)
    check_export(args, args.arch)
    check_import(args, args.arch)
    print(f"hf interop {args.arch}: ok")


if __name__ == "__main__":
    main()
