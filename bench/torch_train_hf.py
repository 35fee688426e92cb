#!/usr/bin/env python3
"""PyTorch 2 baseline for bench/torch_compare.sh: trains a Hugging Face
transformers model (the directory `anvil ckpt export --hf` wrote, so the
architecture and the starting weights are anvil's) with torch.optim.AdamW
on random tokens, in eager mode or under torch.compile, fp32 or autocast
bf16, on the CPU or a CUDA GPU (scripts/gpu-check.sh), and prints one JSON line: median seconds per step and tokens/s over
the timed steps, and the seconds the first (compiling) step took.

The step is what anvil's is: forward, cross-entropy over B x T next tokens,
backward, global-norm clipping at 1.0, AdamW (PyTorch's fused kernel where
it has one). Attention runs through PyTorch's scaled_dot_product_attention;
for the dense families (gpt2, llama) as a causal attention with no mask
built (is_causal=True), which torch.compile otherwise loses: transformers
materialises the causal mask while compiling (before torch 2.14), and an
explicit mask rules out the flash kernels. Under --compile the loss is
compiled with the model. --experts picks transformers' MoE experts
implementation (eager: a loop over the experts hit; batched_mm; grouped_mm).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def causal_attention():
    """Registers an attention for transformers that is SDPA with is_causal=True
    and no mask (the training batches have no padding), and returns its name;
    "sdpa" where this transformers has no registries for it."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return "sdpa"

    def causal_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                    **kwargs):
        out = F.scaled_dot_product_attention(
            query, key, value, dropout_p=dropout if module.training else 0.0, scale=scaling,
            is_causal=True, enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("causal_sdpa", causal_sdpa)
    AttentionMaskInterface.register("causal_sdpa", lambda *args, **kwargs: None)
    return "causal_sdpa"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("-B", type=int, default=4, help="sequences per step")
    p.add_argument("-T", type=int, default=256, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=3, help="timed steps, after one untimed step")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="fp32, or bf16 under torch.autocast (fp32 master weights)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where it trains (cuda: TF32 off unless --tf32)")
    p.add_argument("--tf32", action="store_true", help="cuda: TensorFloat-32 matmuls")
    p.add_argument("--experts", default="eager",
                   help="transformers' experts_implementation for MoE models")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    cfg = json.load(open(f"{a.model}/config.json"))
    dense = cfg.get("model_type") in ("gpt2", "llama")
    kw = {"dtype": torch.float32, "attn_implementation": causal_attention() if dense else "sdpa"}
    if "num_experts" in cfg:
        kw["experts_implementation"] = a.experts
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw).to(a.device)
    model.train()
    V = model.config.vocab_size
    adamw = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **adamw)
    except (RuntimeError, TypeError):  # no fused kernel for this device or torch
        opt = torch.optim.AdamW(model.parameters(), **adamw)

    def loss_of(idx):
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(input_ids=idx[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, V), idx[:, 1:].reshape(-1))

    fwd_loss = torch.compile(loss_of) if a.compile else loss_of

    def step(idx):
        opt.zero_grad(set_to_none=True)
        loss = fwd_loss(idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    times, first = [], 0.0
    for s in range(a.steps + 1):
        idx = torch.randint(0, V, (a.B, a.T + 1), device=a.device)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(idx)  # .item() waits for the GPU
        dt = time.perf_counter() - t0
        if s == 0:
            first = dt
        else:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({"seconds_per_step": med, "tokens_per_second": a.B * a.T / med,
                      "first_step_seconds": first, "steps": a.steps, "loss": loss,
                      "dtype": a.dtype, "compile": a.compile, "device": a.device,
                      "attention": kw["attn_implementation"],
                      "adamw_fused": bool(opt.defaults.get("fused")),
                      "peak_memory_bytes": (torch.cuda.max_memory_allocated()
                                            if a.device == "cuda" else None), "experts": a.experts,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
