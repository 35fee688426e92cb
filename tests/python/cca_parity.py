#!/usr/bin/python3
"""PyTorch reference of ZAYA1's CCA attention layer, written from
docs/zaya1-spec.md section 3 (the convolutions as the reference code runs
them: conv1d with 2 zeros of left padding in total). Compares anvil's
output and every gradient (from tests/model/cca_parity_dump) within 1e-4.
"""
import math
import sys

import torch
import torch.nn.functional as F

from decoder_parity import finish, read_safetensors, report



def rope_half(x, theta, rotary):
    T = x.shape[1]
    half = rotary // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / rotary))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv.float()[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    a, b, rest = x[..., :half], x[..., half:rotary], x[..., rotary:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)


def cca(w, x, Hq, Hkv, d, rotary, theta, p="model.layers.0.self_attn."):
    B, S, H = x.shape
    qp = x @ w[p + "qkv.linear_q.weight"].t()
    kp = x @ w[p + "qkv.linear_k.weight"].t()
    v_cur = x @ w[p + "qkv.val_proj1.weight"].t()
    x_prev = F.pad(x[:, :-1], (0, 0, 1, 0))  # x_{-1} = 0
    v_prev = x_prev @ w[p + "qkv.val_proj2.weight"].t()
    u = torch.cat([qp, kp], dim=-1).transpose(1, 2)  # [B, C, S]
    C = u.shape[1]
    D = F.conv1d(F.pad(u, (2, 0)), w[p + "qkv.conv_qk.0.weight"], w[p + "qkv.conv_qk.0.bias"],
                 groups=C)  # S + 1 outputs: D_{-1} .. D_{S-1}
    conv = F.conv1d(D, w[p + "qkv.conv_qk.1.weight"], w[p + "qkv.conv_qk.1.bias"],
                    groups=C // d).transpose(1, 2)  # [B, S, C]
    cq = conv[..., :Hq * d].reshape(B, S, Hq, d)
    ck = conv[..., Hq * d:].reshape(B, S, Hkv, d)
    g = Hq // Hkv
    qm = (qp.reshape(B, S, Hq, d) + kp.reshape(B, S, Hkv, d).repeat_interleave(g, dim=2)) / 2
    km = qm.reshape(B, S, Hkv, g, d).mean(3)
    q = cq + qm
    k = ck + km
    q = q * math.sqrt(d) / q.norm(dim=-1, keepdim=True)
    k = k * math.sqrt(d) / k.norm(dim=-1, keepdim=True) * w[p + "qkv.temp"][None, None, :, None]
    q, k = rope_half(q, theta, rotary), rope_half(k, theta, rotary)
    v = torch.stack([v_cur, v_prev], dim=2)  # kv head 0: this token, 1: the previous one
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, Hq * d)
    return o @ w[p + "o_proj.weight"].t()


def main(path):
    got, meta = read_safetensors(path + "/cca.safetensors")
    names = [n for n in got if n.startswith("model.")]
    w = {n: got[n].clone().requires_grad_(True) for n in names}
    x = got["x"].clone().requires_grad_(True)
    out = cca(w, x, int(meta["q_heads"]), int(meta["kv_heads"]), int(meta["head_dim"]),
              int(meta["rotary_dim"]), float(meta["rope_theta"]))
    (out * got["r"]).sum().backward()
    pairs = [("out", got["out"], out.detach()), ("grad.x", got["grad.x"], x.grad)]
    pairs += [("grad." + n, got["grad." + n], w[n].grad) for n in names]
    return finish(report(pairs))


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1]))
