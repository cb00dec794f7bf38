#!/usr/bin/env python3
"""Trains a DFlash2 block-diffusion drafter (plugins/draft-dflash2) for kiln's trained tiny target (models/tiny-glm).

The facts it implements are ../shared/specs/dflash2.md §3-§5 and §9 (DFlash2); the exported checkpoint is what
plugins/draft-dflash2 loads through `speculative.draft_model`, and this file's forward is the reference its CPU
forward must match (same conventions: tap = the residual after target layer i = HF hidden_states[i + 1], NeoX RoPE
at each token's own position, per-head q/k RMSNorm before RoPE, two-tap dynamic conv around both sublayers,
candidate selector walk).

Data: the target's training text (tools/train_tiny.py's corpus: stdlib docstrings, the same seeded split), which
the tiny target models well, in windows of --seq-len tokens. The target is frozen; its embedding and lm_head are
shared (frozen), its tapped layer outputs condition the drafter.

Per window: up to --anchors random anchor positions p ≤ S − block; block b = [x_p, MASK × (block − 1)] at positions
p .. p + block − 1 with labels x_{p+k}. One forward over all blocks: a block query sees the context keys of positions
< p (fc + hidden_norm of the target's taps, projected by each layer's k/v) and its own block, nothing else.
Loss: Σ_k w_k CE(draft logits at p + k, x_{p+k}), w_k = exp(−(k − 1)/γ) normalised (γ = 4 for block 8), plus the
selector loss (α = 1): CE over the top-k_sel candidates of row k with the teacher-forced predecessor (x_{p+k−1},
the anchor for k = 1), same weights, positions whose true token is not a candidate excluded. AdamW, warmup 4 %,
cosine decay, clip 1.0. Identity inits of the convs (base tap 0 = 1, projections 0).

Reports (validation text, at the end): teacher-forced top-1 per block position, and greedy acceptance as kiln
measures it, simulated: over the target's own greedy continuations of validation prompts, every position as an
anchor, the walk's drafts 1..K against the target's next tokens (mean accepted length at K = block − 1 and
per-position acceptance); then the acceptance `kiln ab` would report at K5 on its built-in prompts, predicted with
this file's forward (--ab-acceptance; within ~0.05 of kiln's CPU run for the shipped drafter: 2.09 vs 2.05).

  python3 tools/train_dflash.py --out models/tiny-glm-dflash2                 # one H200: well under 10 minutes
  nice -n 10 python3 tools/train_dflash.py --out /tmp/d --device cpu --max-minutes 12   # CPU, what ships
  python3 tools/train_dflash.py --out /tmp/d --quick                           # CPU smoke test (a minute or two)
  python3 tools/train_dflash.py --out /tmp/d --init models/tiny-glm-dflash2 --self-distill 8192
      # on the target's own greedy continuations (what a greedy run drafts against), from the shipped drafter
  python3 tools/train_dflash.py --out /tmp/d --taps 1,3,5                     # other target layers (5: final-normed)
  python3 tools/train_dflash.py --out models/tiny-glm-dflash2 --ab-acceptance 5   # predict kiln ab's K5 acceptance
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tiny  # noqa: E402  (the corpus and split the target was trained on)

REPO = Path(__file__).resolve().parent.parent
MASK_TOKEN = "[MASK]"  # an added token the corpus never contains: a valid embedding row of the target


def default_taps(n_draft: int, n_target: int) -> list[int]:
    if n_draft == 1:
        return [n_target // 2]
    return [round(1 + i * (n_target - 4) / (n_draft - 1)) for i in range(n_draft)]


class RmsNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX rotate-half RoPE; x [..., n, heads, hd], positions broadcastable to [..., n]."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = positions.float()[..., None] * inv  # [..., n, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DynamicConv(nn.Module):
    """Two-tap dynamic depthwise conv (spec §4): prepare before a sublayer, finish after it, within each block."""

    def __init__(self, hidden: int, taps: int, group_size: int):
        super().__init__()
        self.taps, self.groups, self.gs = taps, hidden // group_size, group_size
        base = torch.zeros(2, taps, hidden)
        base[:, 0, :] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def conv(self, x, d, base):
        # x [..., L, H] (one block along L), d [..., L, T, G], base [T, H]
        out = torch.zeros_like(x)
        L = x.shape[-2]
        for o in range(self.taps):
            coef = base[o] + d[..., :, o, :].repeat_interleave(self.gs, -1)  # [..., L, H] at the output position
            shifted = F.pad(x, (0, 0, o, 0))[..., :L, :]  # x[t − o], zero before the block start
            out = out + coef * shifted
        return out

    def prepare(self, x):
        d = self.kernel_projection(x).unflatten(-1, (2, self.taps, self.groups))
        return self.conv(x, d[..., 0, :, :], self.base_kernel[0]), d[..., 1, :, :]

    def finish(self, y, d1):
        return self.conv(y, d1, self.base_kernel[1])


class DraftLayer(nn.Module):
    def __init__(self, c: dict, v2: bool):
        super().__init__()
        H, nh, nkv, hd, I = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
        eps = c["rms_norm_eps"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.input_layernorm, self.post_attention_layernorm = RmsNorm(H, eps), RmsNorm(H, eps)
        a = nn.Module()
        a.q_proj, a.k_proj = nn.Linear(H, nh * hd, bias=False), nn.Linear(H, nkv * hd, bias=False)
        a.v_proj, a.o_proj = nn.Linear(H, nkv * hd, bias=False), nn.Linear(nh * hd, H, bias=False)
        a.q_norm, a.k_norm = RmsNorm(hd, eps), RmsNorm(hd, eps)
        self.self_attn = a
        m = nn.Module()
        m.gate_proj, m.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        m.down_proj = nn.Linear(I, H, bias=False)
        self.mlp = m
        if v2:
            dc = c["dflash_config"]
            self.attention_conv = DynamicConv(H, dc["conv_kernel_size"], dc["conv_group_size"])
            self.mlp_conv = DynamicConv(H, dc["conv_kernel_size"], dc["conv_group_size"])
        self.v2, self.theta = v2, c["rope_theta"]

    def context_kv(self, ctx, positions):
        a = self.self_attn
        k = a.k_norm(a.k_proj(ctx).unflatten(-1, (self.nkv, self.hd)))
        return rope(k, positions, self.theta), a.v_proj(ctx).unflatten(-1, (self.nkv, self.hd))

    def forward(self, h, q_pos, ctx_k, ctx_v, mask):
        """h [B, A, bs, H] blocks; q_pos [B, A, bs]; ctx_k/v [B, S, nkv, hd]; mask [B, A·bs, S + A·bs] (True = see)."""
        B, A, bs, H = h.shape
        a = self.self_attn
        x = self.input_layernorm(h)
        if self.v2:
            x, d1 = self.attention_conv.prepare(x)
        q = rope(a.q_norm(a.q_proj(x).unflatten(-1, (self.nh, self.hd))), q_pos, self.theta)
        k = rope(a.k_norm(a.k_proj(x).unflatten(-1, (self.nkv, self.hd))), q_pos, self.theta)
        v = a.v_proj(x).unflatten(-1, (self.nkv, self.hd))
        keys = torch.cat([ctx_k, k.flatten(1, 2)], 1).transpose(1, 2)  # [B, nkv, S + A·bs, hd]
        vals = torch.cat([ctx_v, v.flatten(1, 2)], 1).transpose(1, 2)
        rep = self.nh // self.nkv
        keys, vals = keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q.flatten(1, 2).transpose(1, 2), keys, vals, attn_mask=mask[:, None])
        y = a.o_proj(out.transpose(1, 2).flatten(2)).view(B, A, bs, H)
        if self.v2:
            y = self.attention_conv.finish(y, d1)
        h = h + y
        x = self.post_attention_layernorm(h)
        if self.v2:
            x, d1 = self.mlp_conv.prepare(x)
        y = self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))
        if self.v2:
            y = self.mlp_conv.finish(y, d1)
        return h + y


class Selector(nn.Module):
    def __init__(self, hidden: int, vocab: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)

    def rows(self, h, logits, prev, k_sel):
        """S_t(prev, C_t[j]) for every draft row: h [..., H] normed, logits [..., V], prev [...] → (row, cand)."""
        top, cand = logits.topk(k_sel, -1)
        g = self.hidden_projection(h)  # [..., R]
        a = self.predecessor_codebook[prev]  # [..., R]
        b = self.successor_codebook[cand]  # [..., k, R]
        return top + ((a * g)[..., None, :] * b).sum(-1), cand


class Drafter(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.c, self.v2 = c, c["architectures"] == ["DFlash2DraftModel"]
        H, n_taps = c["hidden_size"], len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_taps * c["target_hidden_size"], H, bias=False)
        self.hidden_norm, self.norm = RmsNorm(H, c["rms_norm_eps"]), RmsNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DraftLayer(c, self.v2) for _ in range(c["num_hidden_layers"])])
        if self.v2:
            self.candidate_selector = Selector(H, c["vocab_size"], c["dflash_config"]["selector_rank"])

    def forward(self, taps, ids, anchors, embed):
        """taps [B, S, n·H_t]; ids [B, S]; anchors [B, A] → normed hidden [B, A, bs, H] (row 0 = anchor)."""
        dc = self.c["dflash_config"]
        bs, mask_id = dc["block_size"], dc["mask_token_id"]
        B, S = ids.shape
        A = anchors.shape[1]
        dev = ids.device
        ctx = self.hidden_norm(self.fc(taps))
        ctx_pos = torch.arange(S, device=dev).expand(B, S)
        q_pos = anchors[..., None] + torch.arange(bs, device=dev)  # [B, A, bs]
        block_ids = torch.full((B, A, bs), mask_id, device=dev, dtype=torch.long)
        block_ids[..., 0] = ids.gather(1, anchors)
        h = embed(block_ids)
        # A query of block b sees context positions < p_b and its own block.
        see_ctx = ctx_pos[:, None, :] < anchors[..., None]  # [B, A, S]
        see_ctx = see_ctx[:, :, None, :].expand(B, A, bs, S).reshape(B, A * bs, S)
        blk = torch.arange(A, device=dev).repeat_interleave(bs)
        see_blk = (blk[:, None] == blk[None, :]).expand(B, A * bs, A * bs)
        mask = torch.cat([see_ctx, see_blk], -1)
        for layer in self.layers:
            ck, cv = layer.context_kv(ctx, ctx_pos)
            h = layer(h, q_pos, ck, cv, mask)
        return self.norm(h)


def drafter_config(target: dict, mask_id: int, args) -> dict:
    L, H = target["num_hidden_layers"], target["hidden_size"]
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "hidden_size": H,
        "target_hidden_size": H,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": H // args.heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": target["vocab_size"],
        "rope_theta": 1000000.0,
        "layer_types": ["sliding_attention"] * args.layers,
        "sliding_window": 2048,
        "use_sliding_window": True,
        "is_causal": False,
        "num_target_layers": L,
        "tie_word_embeddings": False,
        "dflash_config": {
            "target_layer_ids": args.taps if args.taps else default_taps(args.layers, L),
            "mask_token_id": mask_id,
            "block_size": args.block,
            "conv_kernel_size": 2,
            "conv_group_size": 16,
            "selector_rank": args.rank,
            "selector_top_k": 16,
        },
    }


def decay_weights(bs: int) -> torch.Tensor:
    gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(bs, max(1.0, bs / 2))
    w = torch.exp(-torch.arange(bs - 1, dtype=torch.float32) / gamma)
    return w / w.sum()


class Target:
    """The frozen tiny target: tapped layer outputs, embedding and lm_head (fp32)."""

    def __init__(self, path: Path, taps: list[int], device):
        import transformers
        from transformers.models.glm4_moe_lite import Glm4MoeLiteForCausalLM

        transformers.logging.set_verbosity_error()
        self.model = Glm4MoeLiteForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        self.model.requires_grad_(False)
        self.taps = taps

    def embed(self, ids):
        return self.model.model.embed_tokens(ids)

    def lm_head(self, h):
        return self.model.lm_head(h)

    @torch.no_grad()
    def tapped(self, ids, want_greedy: bool = False):
        out = self.model(input_ids=ids, output_hidden_states=True, logits_to_keep=0 if want_greedy else 1)
        taps = torch.cat([out.hidden_states[i + 1] for i in self.taps], -1)
        return (taps, out.logits.argmax(-1)) if want_greedy else taps


@torch.no_grad()
def self_distilled_windows(target: Target, stream: torch.Tensor, gen: torch.Generator, count: int, width: int,
                           prompt_len: int, batch: int = 512) -> torch.Tensor:
    """`count` windows of `width` tokens: a random text prompt of prompt_len tokens and the target's greedy
    continuation of it — the sequences a greedy kiln run drafts against, so every label is the target's own next
    token given a context the target wrote (what acceptance measures), not the text's."""
    out = []
    for first in range(0, count, batch):
        n = min(batch, count - first)
        prompts = train_tiny.random_windows(stream, gen, n, prompt_len)
        new = width - prompt_len
        out.append(target.model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False))
    return torch.cat(out)[:, :width]


def losses(drafter: Drafter, target: Target, ids: torch.Tensor, n_anchors: int, gen: torch.Generator,
           greedy_labels: bool = False):
    dc = drafter.c["dflash_config"]
    bs, k_sel = dc["block_size"], dc["selector_top_k"]
    B, S = ids.shape
    taps, greedy = target.tapped(ids, want_greedy=True) if greedy_labels else (target.tapped(ids), None)
    anchors = torch.stack([torch.randperm(S - bs + 1, generator=gen)[:n_anchors] for _ in range(B)]).to(ids.device)
    h = drafter(taps, ids, anchors, target.embed)  # [B, A, bs, H]
    pos = anchors[..., None] + torch.arange(bs, device=ids.device)
    labels = ids.gather(1, pos.flatten(1)).view_as(pos)  # x_{p+k}
    if greedy_labels:
        # Drafts 1..K against the target's greedy continuation from the anchor: label k = the target's argmax after
        # the text up to p + k − 1 (teacher forcing on the text; the greedy chain itself only where they agree).
        greedy_next = greedy.gather(1, (pos[..., :-1]).flatten(1)).view(B, -1, bs - 1)
        labels = torch.cat([labels[..., :1], greedy_next], -1)
    logits = target.lm_head(h[:, :, 1:])  # [B, A, bs−1, V]
    w = decay_weights(bs).to(ids.device)
    ce = F.cross_entropy(logits.flatten(0, 2), labels[..., 1:].flatten(), reduction="none").view(B, -1, bs - 1)
    loss = (ce * w).sum(-1).mean()
    acc = (logits.argmax(-1) == labels[..., 1:]).float().mean((0, 1))
    sel_loss = torch.zeros((), device=ids.device)
    if drafter.v2:
        row, cand = drafter.candidate_selector.rows(h[:, :, 1:], logits, labels[..., :-1], k_sel)
        hit = cand == labels[..., 1:, None]
        present = hit.any(-1)
        sel_ce = F.cross_entropy(row.flatten(0, 2), hit.float().argmax(-1).flatten(), reduction="none").view_as(present)
        weights = w * present
        sel_loss = (sel_ce * weights).sum() / weights.sum().clamp_min(1e-6)
    return loss, sel_loss, acc


@torch.no_grad()
def walk(drafter: Drafter, h: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, k_sel: int) -> torch.Tensor:
    """Greedy drafts of every block: v2 by the selector walk, v1 by argmax. h [N, K, H], logits [N, K, V]."""
    if not drafter.v2:
        return logits.argmax(-1)
    prev, out = anchor, []
    for t in range(h.shape[1]):
        row, cand = drafter.candidate_selector.rows(h[:, t], logits[:, t], prev, k_sel)
        prev = cand.gather(1, row.argmax(-1, keepdim=True))[:, 0]
        out.append(prev)
    return torch.stack(out, 1)


@torch.no_grad()
def acceptance(drafter: Drafter, target: Target, val_ids: torch.Tensor, prompts: int, prompt_len: int, new: int):
    """Greedy acceptance as kiln sees it: the target's greedy continuation of each prompt; every continuation
    position as the anchor, drafts 1..K compared with the target's next tokens."""
    dc = drafter.c["dflash_config"]
    bs = dc["block_size"]
    K = bs - 1
    dev = val_ids.device
    step = max(1, (val_ids.numel() - prompt_len) // prompts)
    starts = torch.arange(prompts) * step
    seqs = torch.stack([val_ids[s: s + prompt_len] for s in starts.tolist()]).long().to(dev)
    seqs = target.model.generate(seqs, max_new_tokens=new + bs, do_sample=False, min_new_tokens=new + bs)
    taps = target.tapped(seqs)
    anchors = torch.arange(prompt_len, prompt_len + new, device=dev).expand(prompts, new)
    h = drafter(taps, seqs, anchors, target.embed)[:, :, 1:]
    logits = target.lm_head(h)
    drafts = walk(drafter, h.flatten(0, 1), logits.flatten(0, 1), seqs.gather(1, anchors).flatten(), dc["selector_top_k"])
    truth = seqs.gather(1, (anchors[..., None] + torch.arange(1, bs, device=dev)).flatten(1)).view(-1, K)
    ok = (drafts == truth).long().cumprod(1)  # drafts 1..k all right
    return ok.float().mean(0).tolist(), float(ok.sum(1).float().mean())


def export(drafter: Drafter, out: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(drafter.c, indent=2) + "\n")
    (out / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")


# `kiln ab`'s built-in prompts (apps/kiln/cmd_ab.cpp): what its acceptance columns are measured on.
AB_PROMPTS = ["The socket module provides", "Return a new list", "This module implements", "Raise an exception if",
              "The default value is", "Create a new thread", "Read the file and", "If the argument is"]


@torch.no_grad()
def ab_acceptance(drafter_dir: Path, target_dir: Path, depth: int, new: int = 128) -> dict:
    """Greedy acceptance as `kiln ab --max-tokens 128` reports it, predicted on the CPU with this file's forward: the
    target's greedy continuation of each built-in prompt, run as the speculative loop runs it (the first anchor is
    the first generated token; after a step accepting a drafts, the next anchor is a + 1 tokens on), the drafts
    taken from the full block and cut at `depth`. Per-position acceptance = the share of steps accepting at least
    that many; mean acceptance length = 1 + accepted per step (the bonus token counted)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer as Tok

    c = json.loads((drafter_dir / "config.json").read_text())
    drafter = Drafter(c)
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()})
    drafter.eval()
    target = Target(target_dir, c["dflash_config"]["target_layer_ids"], torch.device("cpu"))
    tok = Tok.from_file(str(target_dir / "tokenizer.json"))
    dc = c["dflash_config"]
    bs = dc["block_size"]
    assert 1 <= depth <= bs - 1, f"depth {depth} outside 1..{bs - 1}"
    reached, steps = torch.zeros(depth), 0
    for text in AB_PROMPTS:
        ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
        P = ids.shape[1]
        seq = target.model.generate(ids, max_new_tokens=new + bs, do_sample=False, min_new_tokens=new + bs)
        anchors = torch.arange(P, P + new).view(1, -1)
        h = drafter(target.tapped(seq), seq, anchors, target.embed)[:, :, 1:]
        drafts = walk(drafter, h[0], target.lm_head(h)[0], seq[0, anchors[0]], dc["selector_top_k"])
        truth = seq[0, anchors[0][:, None] + torch.arange(1, bs)]
        ok = (drafts == truth).long().cumprod(1)[:, :depth]
        a = P
        while a < P + new - 1:
            acc = int(ok[a - P].sum())
            reached[:acc] += 1
            steps += 1
            a += acc + 1
    per_pos = (reached / steps).tolist()
    return {"depth": depth, "prompts": len(AB_PROMPTS), "max_tokens": new, "steps": steps,
            "per_position": [round(x, 3) for x in per_pos], "mean_acceptance_length": round(1 + sum(per_pos), 3)}


@torch.no_grad()
def write_reference(drafter_dir: Path, target_dir: Path, out: Path) -> None:
    """Greedy drafts of the exported drafter (its bf16 values in fp32) for a few anchors of the target's greedy
    continuations, as kiln's drafter must propose them (plugins/draft-dflash2/tests compare)."""
    from safetensors.torch import load_file

    c = json.loads((drafter_dir / "config.json").read_text())
    drafter = Drafter(c)
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()})
    drafter.eval()
    target = Target(target_dir, c["dflash_config"]["target_layer_ids"], torch.device("cpu"))
    dc = c["dflash_config"]
    cases = []
    for prompt in ([1437, 309, 3264, 14, 880, 37], [100, 200, 300, 400, 500, 600, 700, 800, 900]):
        seq = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24)
        taps = target.tapped(seq)
        anchors = torch.tensor([[len(prompt) + 3, len(prompt) + 11]])
        h = drafter(taps, seq, anchors, target.embed)[:, :, 1:]
        logits = target.lm_head(h)
        drafts = walk(drafter, h[0], logits[0], seq[0, anchors[0]], dc["selector_top_k"])
        for a, d in zip(anchors[0].tolist(), drafts.tolist()):
            cases.append({"tokens": seq[0, : a + 1].tolist(), "anchor_position": a, "drafts": d})
    out.write_text(json.dumps({"drafter": str(drafter_dir.name), "cases": cases}, indent=1) + "\n")
    print(f"wrote {out}: {len(cases)} cases")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=REPO / "models" / "tiny-glm")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="training budget (cosine decay ends there)")
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=None, help="windows per step (default: 64 on cuda, 8 on cpu)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=32, help="anchor blocks per window")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--taps", type=lambda s: [int(t) for t in s.split(",")], default=None,
                    help="target layers tapped, e.g. 1,3,5 (default: the published spread over the target, which for "
                         "a 6-layer target is 1,3; the last layer's tap is its output after the final norm, as HF's "
                         "hidden_states[L] is)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--rank", type=int, default=64, help="selector rank R")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: a minute of training, small evaluation")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--init", type=Path, metavar="DIR", help="start from this exported drafter (same shapes)")
    ap.add_argument("--greedy-labels", action="store_true",
                    help="label drafts with the target's greedy next tokens instead of the text")
    ap.add_argument("--self-distill", type=int, default=0, metavar="N",
                    help="train on N windows of the target's greedy continuations of text prompts instead of the text")
    ap.add_argument("--distill-prompt", type=int, default=32, help="prompt tokens of each self-distilled window")
    ap.add_argument("--ab-acceptance", type=int, metavar="K", default=0,
                    help="instead of training: predict kiln ab's greedy acceptance at depth K for the drafter in --out "
                         "(its built-in prompts, 128 tokens, the speculative loop's anchors) on the CPU")
    ap.add_argument("--reference", type=Path, metavar="JSON",
                    help="instead of training: write the greedy drafts of the drafter in --out (exported) to JSON")
    args = ap.parse_args()
    if args.reference:
        write_reference(args.out, args.target, args.reference)
        return 0
    if args.ab_acceptance:
        r = ab_acceptance(args.out, args.target, args.ab_acceptance)
        print(f"{args.out}: predicted kiln ab acceptance at K{r['depth']} ({r['steps']} steps): mean length "
              f"{r['mean_acceptance_length']:.2f}, per position " + " ".join(f"{x:.2f}" for x in r["per_position"]))
        return 0
    if args.quick:
        args.device, args.max_minutes, args.seq_len, args.anchors = "cpu", min(args.max_minutes, 1.0), 128, 8
    if args.batch is None:
        args.batch = 64 if args.device.startswith("cuda") else 8
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    t0 = time.time()

    tokenizer = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    mask_id = tokenizer.token_to_id(MASK_TOKEN)
    docs = train_tiny.corpus_documents()
    train_ids, val_ids = train_tiny.token_streams(tokenizer, docs, 1234)  # the target's own split
    assert not (train_ids == mask_id).any(), "the MASK token occurs in the text"
    target_cfg = json.loads((args.target / "config.json").read_text())
    c = drafter_config(target_cfg, mask_id, args)
    target = Target(args.target, c["dflash_config"]["target_layer_ids"], device)
    drafter = Drafter(c)
    if args.init:
        from safetensors.torch import load_file

        state = {k: v.float() for k, v in load_file(str(args.init / "model.safetensors")).items()}
        init_taps = json.loads((args.init / "config.json").read_text())["dflash_config"]["target_layer_ids"]
        taps = c["dflash_config"]["target_layer_ids"]
        if init_taps != taps:
            # Different taps: fc's columns follow the taps (one target-hidden-wide slice each); a tap the init had
            # keeps its trained slice, a new one starts at zero so the drafter begins as the init.
            Ht = c["target_hidden_size"]
            fc = torch.zeros(state["fc.weight"].shape[0], len(taps) * Ht)
            for j, t in enumerate(taps):
                if t in init_taps:
                    i = init_taps.index(t)
                    fc[:, j * Ht:(j + 1) * Ht] = state["fc.weight"][:, i * Ht:(i + 1) * Ht]
            state["fc.weight"] = fc
        drafter.load_state_dict(state)
        print(f"starting from {args.init} (taps {init_taps})")
    drafter = drafter.to(device)
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"corpus {train_ids.numel()} train / {val_ids.numel()} val tokens; drafter {n_params / 1e6:.2f} M params, "
          f"taps {c['dflash_config']['target_layer_ids']}, block {args.block}; device {device} "
          f"({time.time() - t0:.0f} s)", flush=True)

    decay = [p for p in drafter.parameters() if p.dim() >= 2]
    rest = [p for p in drafter.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train_ids.to(device)
    distilled = None
    if args.self_distill:
        distilled = self_distilled_windows(target, train_dev, gen, args.self_distill, args.seq_len, args.distill_prompt)
        print(f"self-distilled {distilled.shape[0]} windows of {distilled.shape[1]} tokens "
              f"({time.time() - t0:.0f} s)", flush=True)
    start, step = time.time(), 0
    budget = args.max_minutes * 60
    while step < args.steps:
        step += 1
        progress = min(1.0, max(step / args.steps, (time.time() - start) / budget))
        lr = args.lr * min(1.0, progress / 0.04) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        if distilled is not None:
            windows = distilled[torch.randint(0, distilled.shape[0], (args.batch,), generator=gen).to(device)]
        else:
            windows = train_tiny.random_windows(train_dev, gen, args.batch, args.seq_len)
        loss, sel, acc = losses(drafter, target, windows, args.anchors, gen, args.greedy_labels)
        opt.zero_grad(set_to_none=True)
        (loss + sel).backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == 1:
            print(f"step {step:5d}  ce {loss.item():.3f}  selector {sel.item():.3f}  top1 "
                  + " ".join(f"{a:.2f}" for a in acc.tolist()) + f"  lr {lr:.1e}  {time.time() - start:.0f} s", flush=True)
        if progress >= 1.0:
            break
    train_seconds = time.time() - start
    drafter.eval()
    prompts, new = (4, 32) if args.quick else (16, 64)
    per_pos, mean_len = acceptance(drafter, target, val_ids.to(device), prompts, 32, new)
    print(f"trained {step} steps in {train_seconds:.0f} s; simulated greedy acceptance at K = {args.block - 1} "
          f"(target's greedy continuations of {prompts} validation prompts): mean accepted {mean_len:.2f}, "
          "per position " + " ".join(f"{a:.2f}" for a in per_pos), flush=True)
    info = {"init": str(args.init) if args.init else None, "greedy_labels": args.greedy_labels,
            "self_distill": args.self_distill, "distill_prompt": args.distill_prompt, "lr": args.lr,
            "steps": step, "train_seconds": round(train_seconds, 1), "device": str(device), "batch": args.batch,
            "seq_len": args.seq_len, "anchors": args.anchors, "seed": args.seed, "torch": torch.__version__,
            "simulated_greedy_acceptance": {"K": args.block - 1, "mean_accepted": round(mean_len, 3),
                                            "per_position": [round(a, 3) for a in per_pos]}}
    export(drafter.cpu(), args.out, info)
    ab = ab_acceptance(args.out, args.target, min(5, args.block - 1))
    info["predicted_kiln_ab_acceptance"] = ab
    (args.out / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"predicted kiln ab acceptance at K{ab['depth']}: mean length {ab['mean_acceptance_length']:.2f}, "
          "per position " + " ".join(f"{x:.2f}" for x in ab["per_position"]), flush=True)
    print(f"wrote {args.out} ({(args.out / 'model.safetensors').stat().st_size / 1e6:.1f} MB); total "
          f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
