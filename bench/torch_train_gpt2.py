#!/usr/bin/python3
"""PyTorch baseline for bench/train_throughput.sh: GPT-2 124M (the same
shape as configs/gpt2-124m.json: vocab 50304, tied embeddings, LayerNorm,
GELU-tanh MLP, fused qkv) trained with AdamW in fp32 on random tokens.
Prints one JSON line: median seconds per step and tokens/s.
Run it with the same OPENBLAS_CORETYPE and thread count as anvil.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.out = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // self.H)
        s = s.masked_fill(mask[:T, :T], float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V=50304, T=1024, C=768, L=12, H=12):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1))
        for name, p in self.named_parameters():  # GPT-2 init, as anvil's registry
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-B", type=int, default=4)
    p.add_argument("-T", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for step in range(a.steps + 1):
        idx = torch.randint(0, 50304, (a.B, a.T + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step > 0:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"seconds_per_step": med, "tokens_per_second": a.B * a.T / med,
                      "steps": a.steps, "loss": loss.item()}))


if __name__ == "__main__":
    main()
