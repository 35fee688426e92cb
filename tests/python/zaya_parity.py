#!/usr/bin/python3
"""PyTorch reference of the whole ZAYA1 model (docs/zaya1-spec.md section 2:
embedding, alternating CCA / MoE layers behind residual-scaling merges and
RMSNorms, final merge and norm, tied classifier, cross-entropy), composed from
the layer references in cca_parity.py and moe_parity.py. Checks anvil's
logits, loss, every gradient and every MoE layer's expert choices.
"""
import json
import sys

import torch
import torch.nn.functional as F

from cca_parity import cca
from decoder_parity import finish, read_safetensors, report
from moe_parity import check_choices, grads_of, moe



def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def merge(w, prefix, r, h):
    out = (h + w[prefix + "hidden_states_bias"]) * w[prefix + "hidden_states_scale"]
    if r is not None:
        out = out + (r + w[prefix + "residual_bias"]) * w[prefix + "residual_scale"]
    return out


def zaya(cfg, w, tokens):
    B, T = tokens.shape
    H, eps = cfg["d_model"], cfg["norm_eps"]
    h = w["model.embed_tokens.weight"][tokens]
    r, rstate, choices = None, None, {}
    for n in range(2 * cfg["n_layers"]):
        p = f"model.layers.{n}."
        r = merge(w, p + "res_scale.", r, h)
        x = rmsnorm(r, w[p + "input_norm.weight"], eps)
        if n % 2 == 0:
            h = cca(w, x, cfg["n_heads"], 2, cfg["head_dim"], cfg["rotary_dim"] or cfg["head_dim"],
                    cfg["rope_theta"], p=p + "self_attn.")
        else:
            out, rstate, choice, _, _ = moe(w, x.reshape(B * T, H), rstate, cfg["n_experts"],
                                      cfg["expert_ffn_hidden"], cfg.get("top_k", 1), a=p + "zaya_block.")
            h = out.reshape(B, T, H)
            choices[n] = choice
    r = merge(w, "model.res_scale.", r, h)
    x = rmsnorm(r, w["model.final_norm.weight"], eps)
    return x @ w["model.embed_tokens.weight"].t(), choices


def main(path):
    got, meta = read_safetensors(path + "/zaya.safetensors")
    cfg = json.loads(meta["config"])
    names = [n for n in got if n.startswith("model.") and not n.endswith("balancing_biases")]
    w = {n: got[n].clone().requires_grad_(True) for n in names}
    for n in got:
        if n.endswith("balancing_biases"):
            w[n] = got[n]
    tokens, targets = got["tokens"].long(), got["targets"].long()
    logits, choices = zaya(cfg, w, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    failures = []
    for n, choice in choices.items():
        failures += check_choices(f"layer {n}", choice, got[f"choices.{n}"], cfg["n_experts"])
    pairs = [("logits", got["logits"], logits.detach()), ("loss", got["loss"], loss.detach().view(1))]
    pairs += grads_of(names, w, got)
    return finish(failures + report(pairs))


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1]))
