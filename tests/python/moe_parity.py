#!/usr/bin/python3
"""PyTorch reference of ZAYA1's MoE layer (router with EDA, skip class,
biased top-k (k = 1 is ZAYA1's) with unbiased gates; SwiGLU experts; skip
output gate * x),
written from docs/zaya1-spec.md section 4. Checks anvil's expert choices
(identical, some of them skip), outputs and every gradient within 1e-4.
With the optional router losses on (metadata aux_coef, z_coef), the
objective includes the Switch load-balancing loss coef * E * sum_e f_e P_e
(f_e = tokens routed to expert e / N, a constant; P_e = mean probability of
e) and the z-loss coef * mean_n logsumexp(logits_n)^2, and their values
are compared too.
"""
import sys

import torch
import torch.nn.functional as F

from decoder_parity import finish, read_safetensors, report



def moe(w, x, rstate_prev, E, Fh, k=1, a="model.layers.3.zaya_block."):
    r = a + "router."
    h = x @ w[r + "down_proj.weight"].t() + w[r + "down_proj.bias"]
    if rstate_prev is not None:                              # EDA (not in the first MoE layer)
        h = h + rstate_prev * w[r + "router_states_scale"]
    rstate = h
    z = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w[r + "rmsnorm_eda.weight"]
    z = F.gelu(z @ w[r + "router_mlp.0.weight"].t() + w[r + "router_mlp.0.bias"])  # exact erf
    z = F.gelu(z @ w[r + "router_mlp.2.weight"].t() + w[r + "router_mlp.2.bias"])
    logits = z @ w[r + "router_mlp.4.weight"].t()
    p = logits.softmax(-1)
    choice = (p + w[r + "balancing_biases"]).topk(k, -1).indices  # [N, k], selection only
    gate = p.gather(-1, choice)                          # unbiased, not renormalised
    out = torch.zeros_like(x)
    for e in range(E + 1):
        rows, j = (choice == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = x[rows]
        if e == E:
            ye = xe                                      # the skip class: gate * x
        else:
            ex = a + f"experts.local_experts.{e}."
            y = xe @ w[ex + "linear_fc1.weight"].t()
            ye = (F.silu(y[:, :Fh]) * y[:, Fh:]) @ w[ex + "linear_fc2.weight"].t()
        out = out.index_add(0, rows, gate[rows, j, None] * ye)
    return out, rstate, choice, logits, p


def router_losses(logits, p, choice, E, aux_coef, z_coef):
    N = len(logits)
    counts = torch.bincount(choice.flatten(), minlength=E + 1)[:E].to(p.dtype)
    aux = aux_coef * E * (counts / N * p[:, :E].mean(0)).sum()
    z = z_coef * torch.logsumexp(logits, -1).pow(2).mean()
    return aux, z


def check_choices(label, choice, expected, E):
    """Identical choices, with every expert and the skip class (index E) used."""
    same = choice.flatten().float().tolist() == expected.flatten().tolist()
    used = len(set(choice.flatten().tolist()))
    skips = int((choice.reshape(len(choice), -1) == E).any(-1).sum())
    ok = same and used == E + 1
    print(f"{'ok' if ok else 'FAIL':4} {label} expert choices identical: {same}, "
          f"{used} of {E + 1} classes used, {skips} of {len(choice)} tokens skip")
    return [] if ok else [label]


def grads_of(names, w, got):
    """(name, anvil, torch) gradient pairs; an expert no token chose has no
    torch gradient, and anvil's is zero."""
    return [("grad." + n, got["grad." + n],
             w[n].grad if w[n].grad is not None else torch.zeros_like(w[n])) for n in names]


def main(path):
    got, meta = read_safetensors(path + "/moe.safetensors")
    E, Fh, k = int(meta["experts"]), int(meta["expert_ffn"]), int(meta.get("top_k", 1))
    names = [n for n in got if n.startswith("model.") and not n.endswith("balancing_biases")]
    w = {n: got[n].clone().requires_grad_(True) for n in names}
    bias_name = next(n for n in got if n.endswith("balancing_biases"))
    w[bias_name] = got[bias_name]
    x = got["x"].clone().requires_grad_(True)
    rp = got["rstate_prev"].clone().requires_grad_(True)
    out, rstate, choice, logits, p = moe(w, x, rp, E, Fh, k)
    aux_coef, z_coef = float(meta.get("aux_coef", 0)), float(meta.get("z_coef", 0))
    aux, z = router_losses(logits, p, choice, E, aux_coef, z_coef)
    ((out * got["r"]).sum() + (rstate * got["r2"]).sum() + aux + z).backward()
    label = f"moe layer (top-{k}" + (f", aux {aux_coef:g}, z {z_coef:g})" if aux_coef or z_coef else ")")
    failures = check_choices(label, choice, got["choices"], E)
    pairs = [("out", got["out"], out.detach()), ("rstate", got["rstate"], rstate.detach()),
             ("aux_loss", got["aux_loss"], aux.detach().reshape(1)),
             ("z_loss", got["z_loss"], z.detach().reshape(1)),
             ("grad.x", got["grad.x"], x.grad), ("grad.rstate_prev", got["grad.rstate_prev"], rp.grad)]
    pairs += grads_of(names, w, got)
    return finish(failures + report(pairs))


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1]))
