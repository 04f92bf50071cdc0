"""Training loops: the target (next-token cross-entropy), then the EAGLE-1 head.

Head loss per row p (target frozen): smooth-L1 between the head's g[p] and the target feature
f[p+1], plus `ce_weight` x cross-entropy against the target's next-token distribution at p+1
(EAGLE-1's regression + classification). Features get uniform noise (EAGLE-1), and a second
unrolled pass feeds the head its own predictions g[p-1] as features, as drafting a chain does.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.llama import LlamaForCausalLM


def init_weights(module: torch.nn.Module, num_layers: int) -> None:
    """GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2 * num_layers)."""
    for name, p in module.named_parameters():
        if p.dim() == 2:
            residual = name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight"))
            std = 0.02 / math.sqrt(2 * num_layers) if residual else 0.02
            torch.nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias") and not name.endswith("dt_bias"):
            torch.nn.init.zeros_(p)


def batch(data: np.ndarray, batch_size: int, seq: int, gen: np.random.Generator, device) -> torch.Tensor:
    """`[B, seq + 1]` random windows of the token stream."""
    starts = gen.integers(0, data.size - seq - 1, size=batch_size)
    x = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x).to(device, non_blocking=True)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _autocast(device):
    dev = torch.device(device)
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")


def _fit_steps(step, steps, t0, time_limit, log, what) -> int:
    """With a time budget, fix the schedule's length once, from steps 10..39 (the cosine then
    anneals fully inside the budget instead of being cut off)."""
    if time_limit and step == 10:
        _fit_steps.t10 = time.time()            # steps 0..9 include CUDA warm-up: not timed
    if time_limit and step == 40:
        per_step = (time.time() - _fit_steps.t10) / 30
        fitted = max(41, min(steps, int((time_limit - (time.time() - t0)) / per_step) + 40))
        log(f"{what}: {per_step * 1e3:.1f} ms/step -> {fitted} steps in {time_limit:.0f}s")
        return fitted
    return steps


def _optimizer(params, lr):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def _optimise(params, loss_fn, *, train, steps, batch_size, seq, lr, warmup, device, log, gen,
              time_limit, tag):
    """The one training loop: AdamW with warm-up + cosine lr, clip 1.0, `_fit_steps` time budget.

    loss_fn(x `[B, S+1]`) -> (loss, note for the log line). Returns (steps run, last loss tensor,
    seconds)."""
    opt = _optimizer(params, lr)
    t0, step, loss = time.time(), 0, None
    while step < steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x = batch(train, batch_size, seq, gen, device)
        with _autocast(device):
            loss, note = loss_fn(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 100 == 1 or step == steps:
            log(f"{tag} step {step} loss {loss.item():.4f} {note} t {time.time() - t0:.0f}s")
        steps = _fit_steps(step, steps, t0, time_limit, log, tag)
    return step, loss, time.time() - t0


@torch.no_grad()
def eval_target(model, data, seq, device, batches=8, batch_size=32) -> float:
    model.eval()
    gen = np.random.default_rng(1234)
    losses = []
    for _ in range(batches):
        x = batch(data, batch_size, seq, gen, device)
        with _autocast(device):
            logits = model.compute_logits(model.forward_dense(x[:, :-1]))
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).item())
    model.train()
    return float(np.mean(losses))


def train_target(cfg: LlamaConfig, train, evald, *, steps, batch_size, seq, lr, device, log,
                 seed=0, warmup=100, time_limit=None) -> tuple[LlamaForCausalLM, dict]:
    torch.manual_seed(seed)
    if type(cfg) is LlamaConfig:
        model = LlamaForCausalLM(cfg).to(device)
    else:                                   # a HybridConfig: gated DeltaNet + attention layers
        from nwor_lab.model.hybrid import HybridForCausalLM
        model = HybridForCausalLM(cfg).to(device)
    init_weights(model, cfg.num_hidden_layers)
    for module in model.modules():          # the decay's spread across heads (Qwen3-Next's init)
        if hasattr(module, "init_decay"):
            module.init_decay()
    def loss_fn(x):
        logits = model.compute_logits(model.forward_dense(x[:, :-1]))
        return F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()), ""
    step, loss_t, seconds = _optimise(list(model.parameters()), loss_fn, train=train, steps=steps,
                                      batch_size=batch_size, seq=seq, lr=lr, warmup=warmup, device=device,
                                      log=log, gen=np.random.default_rng(seed), time_limit=time_limit,
                                      tag="target")
    loss = loss_t.item()
    ev = eval_target(model, evald, seq, device)
    stats = {"steps": step, "final_train_loss": loss, "eval_loss": ev, "seconds": seconds}
    log(f"target done: {stats}")
    return model.eval(), stats


def head_losses(head: EagleHead, target: LlamaForCausalLM, x: torch.Tensor, noise: float,
                ce_weight: float, unroll: int = 2):
    """x `[B, S+1]` -> (total loss, per-step top-1 agreement with the target)."""
    with torch.no_grad():
        f = target.forward_dense(x[:, :-1]).float()                 # [B, S, h]
        want = target.compute_logits(f[:, 1:]).float().argmax(-1)  # target's top-1 at p+1
        p_target = F.softmax(target.compute_logits(f[:, 1:]).float(), -1)
    next_ids = x[:, 1:-1]                                             # x[p+1], rows p = 0..S-2
    feat = f[:, :-1]
    if noise:
        feat = feat + (torch.rand_like(feat) - 0.5) * noise
    total, agree = 0.0, []
    for step in range(unroll):
        g = head.forward_dense(next_ids, feat).float()               # predicts f[p+1]
        logp = F.log_softmax(head.compute_logits(g).float(), -1)
        reg = F.smooth_l1_loss(g, f[:, 1:])
        ce = -(p_target * logp).sum(-1).mean()
        total = total + (reg + ce_weight * ce) / (step + 1)
        agree.append((logp.argmax(-1) == want).float().mean().item())
        feat = torch.cat([f[:, :1], g[:, :-1]], dim=1)               # chain: own predictions as features
    return total, agree


def _fit_head(head, target, losses, noise, *, train, evald, steps, batch_size, seq, lr, warmup, device, log,
              seed, time_limit, tag, extra=None) -> dict:
    """Train a draft head against a frozen target: `losses(x, noise) -> (loss, per-step top-1
    agreement)`; evaluate on held-out batches without noise. Returns the stats dict."""
    init_weights(head, 1)
    for p in target.parameters():
        p.requires_grad_(False)

    def loss_fn(x):
        loss, agree = losses(x, noise)
        return loss, f"top1 {[round(a, 3) for a in agree]}"
    step, loss, seconds = _optimise(list(head.parameters()), loss_fn, train=train, steps=steps,
                                    batch_size=batch_size, seq=seq, lr=lr, warmup=warmup, device=device,
                                    log=log, gen=np.random.default_rng(seed), time_limit=time_limit, tag=tag)
    head.eval()
    with torch.no_grad(), _autocast(device):
        x = batch(evald, 32, seq, np.random.default_rng(4321), device)
        ev_loss, ev_agree = losses(x, 0.0)
    stats = {"steps": step, "final_train_loss": loss.item(), "eval_loss": ev_loss.item(),
             "eval_top1_agreement_by_chain_step": ev_agree, "seconds": seconds, **(extra or {})}
    log(f"{tag} done: {stats}")
    return stats


def train_head(target: LlamaForCausalLM, cfg: LlamaConfig, train, evald, *, steps, batch_size, seq, lr,
               device, log, seed=0, warmup=100, noise=0.2, ce_weight=0.5, time_limit=None):
    torch.manual_seed(seed + 1)
    head = EagleHead(cfg, fc_bias=True).to(device).attach(target)
    stats = _fit_head(head, target, lambda x, noise: head_losses(head, target, x, noise, ce_weight), noise,
                      train=train, evald=evald, steps=steps, batch_size=batch_size, seq=seq, lr=lr,
                      warmup=warmup, device=device, log=log, seed=seed + 1, time_limit=time_limit, tag="head")
    return head, stats


def draft_vocabulary(train: np.ndarray, size: int) -> torch.Tensor:
    """The `size` most frequent token ids of the training stream, ascending (EAGLE-3's draft vocab)."""
    counts = np.bincount(train, minlength=size)
    return torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:size])).long()


def eagle3_losses(head, target, x: torch.Tensor, draft_ids: torch.Tensor, unroll: int = 3):
    """EAGLE-3's training-time test: step 0 reads the fused target features, step s > 0 its own
    step s-1 outputs (shifted by one position). Loss: cross-entropy against the target's next-token
    distribution restricted to the draft vocabulary, weighted 0.8^s. -> (loss, top-1 agreement)."""
    with torch.no_grad():
        f, aux = target.forward_dense(x[:, :-1], aux_layers=head.aux_layers)
        logits = target.compute_logits(f[:, 1:]).float()
        want = logits.argmax(-1)
        p = F.softmax(logits[..., draft_ids], -1)
    next_ids = x[:, 1:-1]
    fused = head.features_from_target(None, aux)
    feat = fused[:, :-1]
    total, agree = 0.0, []
    for step in range(unroll):
        g = head.forward_dense(next_ids, feat)
        logq = F.log_softmax(head.lm_head(head.norm(g)).float(), -1)
        total = total + (-(p * logq).sum(-1).mean()) * 0.8 ** step
        agree.append((draft_ids[logq.argmax(-1)] == want).float().mean().item())
        feat = torch.cat([fused[:, :1], g[:, :-1]], dim=1)
    return total, agree


def train_eagle3(target: LlamaForCausalLM, cfg: LlamaConfig, train, evald, *, draft_vocab_size, steps,
                 batch_size, seq, lr, device, log, seed=0, warmup=100, time_limit=None):
    from nwor_lab.model.eagle3 import Eagle3Head, default_aux_layers
    torch.manual_seed(seed + 2)
    draft_ids = draft_vocabulary(train, draft_vocab_size).to(device)
    head = Eagle3Head(cfg, default_aux_layers(target.config.num_hidden_layers), draft_vocab_size).to(device)
    head.d2t.copy_(draft_ids - torch.arange(draft_vocab_size, device=device))
    head.attach(target)
    stats = _fit_head(head, target, lambda x, noise: eagle3_losses(head, target, x, draft_ids), 0.0,
                      train=train, evald=evald, steps=steps, batch_size=batch_size, seq=seq, lr=lr,
                      warmup=warmup, device=device, log=log, seed=seed + 2, time_limit=time_limit, tag="eagle3",
                      extra={"draft_vocab_size": draft_vocab_size, "aux_layers": list(head.aux_layers)})
    return head, stats
