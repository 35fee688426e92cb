#!/usr/bin/python3
"""PyTorch reference of anvil's dense decoder (GPT-2 and Llama families).

Reads the weights, batch and results that tests/model/parity_dump wrote,
runs the same model in PyTorch (fp32, autograd) and checks logits, loss,
every gradient and ten AdamW steps within 1e-4 relative, and that anvil's
KV-cache decode equals its full forward. Exits non-zero on any mismatch.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

TOL = 1e-4


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[base + b:base + e], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def rope(x, theta, rotary_dim):
    # x: [B, T, H, D]; NeoX rotate-half on the first rotary_dim dims.
    T = x.shape[1]
    half = rotary_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / rotary_dim))
    angles = (torch.arange(T, dtype=torch.float32)[:, None] * inv_freq.float()[None, :])
    cos = angles.cos()[None, :, None, :]
    sin = angles.sin()[None, :, None, :]
    a, b, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)


def forward(cfg, w, tokens):
    B, T = tokens.shape
    C, Hq, Hkv, D = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps = cfg["norm_eps"]
    rotary = cfg["rotary_dim"] or D

    def norm(x, prefix):
        if cfg["norm"] == "layernorm":
            return F.layer_norm(x, (C,), w[prefix + ".weight"], w[prefix + ".bias"], eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[prefix + ".weight"]

    def linear(x, prefix):
        return F.linear(x, w[prefix + ".weight"], w.get(prefix + ".bias"))

    x = w["model.embed_tokens.weight"][tokens]
    if cfg["position"] == "learned":
        x = x + w["model.embed_positions.weight"][:T]
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        h = norm(x, p + "input_layernorm")
        q = linear(h, p + "self_attn.q_proj").view(B, T, Hq, D)
        k = linear(h, p + "self_attn.k_proj").view(B, T, Hkv, D)
        v = linear(h, p + "self_attn.v_proj").view(B, T, Hkv, D)
        if cfg["position"] == "rope":
            q, k = rope(q, cfg["rope_theta"], rotary), rope(k, cfg["rope_theta"], rotary)
        g = Hq // Hkv
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Hq * D)
        x = x + linear(a, p + "self_attn.o_proj")
        h = norm(x, p + "post_attention_layernorm")
        if cfg["mlp"] == "swiglu":
            h = F.silu(linear(h, p + "mlp.gate_proj")) * linear(h, p + "mlp.up_proj")
        else:
            h = F.gelu(linear(h, p + "mlp.up_proj"), approximate="tanh")
        x = x + linear(h, p + "mlp.down_proj")
    x = norm(x, "model.norm")
    head = w["model.embed_tokens.weight"] if cfg["tied_embeddings"] else w["lm_head.weight"]
    return x @ head.t()


def newton_schulz(g, steps=5):
    """Muon's quintic Newton-Schulz orthogonalisation (Keller Jordan's coefficients)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    transposed = g.shape[0] > g.shape[1]
    if transposed:
        x = x.t()
    for _ in range(steps):
        A = x @ x.t()
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.t() if transposed else x


def rel(a, b):
    # Relative to the reference's largest entry. A gradient that is zero in
    # exact arithmetic (the key bias: softmax ignores a shift shared by all
    # keys) is rounding noise on both sides, so the scale has a floor of 1e-6.
    scale = max(b.abs().max().item(), 1e-6)
    return (a - b).abs().max().item() / scale


def report(pairs, tol=TOL):
    """Prints one line per (name, anvil, reference) pair; returns the names that differ."""
    failures = []
    for name, a, b in pairs:
        r = rel(a, b)
        ok = r <= tol
        print(f"{'ok' if ok else 'FAIL':4} {name:70} rel {r:.2e}")
        if not ok:
            failures.append(name)
    return failures


def finish(failures):
    """The exit status: 0 when everything matched."""
    if failures:
        print(f"{len(failures)} mismatches: {', '.join(failures[:5])}")
        return 1
    print("all match")
    return 0


def main(dump):
    weights, _ = read_safetensors(dump + "/weights.safetensors")
    got, meta = read_safetensors(dump + "/anvil.safetensors")
    cfg = json.loads(meta["config"])
    tokens = got["tokens"].long()
    targets = got["targets"].long()
    failures = []

    def check(name, a, b):
        failures.extend(report([(name, a, b)]))

    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    logits = forward(cfg, w, tokens)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
    loss.backward()
    check("logits", got["logits"], logits.detach())
    check("loss", got["loss"], loss.detach().view(1))
    for name in weights:
        check("grad." + name, got["grad." + name], w[name].grad)

    # Ten AdamW steps on the same batch, clipping at 1.0, decay on matrices only.
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    decay = [p for n, p in w.items() if p.dim() >= 2]
    no_decay = [p for n, p in w.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        logits = forward(cfg, w, tokens)
        l = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        losses.append(l.item())
    check("adamw_losses", got["adamw_losses"], torch.tensor(losses))

    # Ten Muon steps on the block matrices, AdamW on the rest, same clipping.
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    muon_params = {n: p for n, p in w.items() if p.dim() == 2 and n.startswith("model.layers.")}
    rest = [p for n, p in w.items() if n not in muon_params]
    opt = torch.optim.AdamW([{"params": [p for p in rest if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    buffers = {n: torch.zeros_like(p) for n, p in muon_params.items()}
    losses = []
    for _ in range(10):
        opt.zero_grad()
        for p in muon_params.values():
            p.grad = None
        logits = forward(cfg, w, tokens)
        l = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        with torch.no_grad():
            for n, p in muon_params.items():
                buf = buffers[n]
                buf.mul_(0.95).add_(p.grad)
                update = newton_schulz(p.grad + 0.95 * buf)
                p.mul_(1 - 1e-3 * 0.1)
                p.add_(update, alpha=-1e-3 * 0.2 * math.sqrt(max(p.shape)))
        losses.append(l.item())
    check("muon_losses", got["muon_losses"], torch.tensor(losses))
    check("decode_logits vs prefill", got["decode_logits"], got["prefill_logits"])
    return finish(failures)


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1]))
