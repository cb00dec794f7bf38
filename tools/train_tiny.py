#!/usr/bin/env python3
"""Trains kiln's tiny demo model: a glm4_moe_lite-shaped model (MLA + MoE) with a DeepSeek-style MTP layer.

Text: docstrings of the Python standard library (every importable stdlib module and package submodule: module,
function, class and method docstrings) plus the reference topics of the Python documentation that ship with
Python (pydoc_data.topics) — freely licensed (PSF) text on every machine, the same source the tokenizer fixture
tests/data/tokenizer/tokenizer.json (4096 ids, byte-level BPE) was trained on; that tokenizer is reused as is.
Documents are joined with <|endoftext|>; 2 % of them (by a seeded shuffle) are held out for validation.

Model (default): hidden 256, 6 layers (layer 0 dense, 1-5 MoE), 8 heads, MLA q_lora 128 / kv_lora 128 /
nope 32 / rope 16 / v 32, 8 routed experts top-2 + 1 shared (moe_intermediate 128), untied lm_head, plus one
MTP layer (models.md §MTP: enorm, hnorm, eh_proj, a MoE decoder block, shared_head.norm; the trunk's embedding
and lm_head). Loss = CE(next token) + mtp_weight · CE(MTP row i → t_{i+2}), trained jointly; the MTP row i sees
the trunk's final-normed hidden state h_i and the embedding of t_{i+1}, at position i + 1 (as the fixture
reference does). Routers use DeepSeek-V3's auxiliary-loss-free balancing: after every step each router's
e_score_correction_bias moves by ±bias_rate towards equal expert load.

Training computes every expert densely and weights by the (sparse, top-k) routing weights: the same function as
transformers' per-expert loop, with static shapes (fast on a GPU for experts this small).

Export (--out DIR): the trunk through Glm4MoeLiteForCausalLM.save_pretrained in bf16 (loadable by transformers;
checked by reloading and comparing logits), the MTP layer appended as model.layers.N.* in the same
model.safetensors (per-expert names, as transformers writes a trunk MoE layer), config.json with
num_nextn_predict_layers = 1 and first_k_dense_replace, and tokenizer.json.

  python3 tools/train_tiny.py --out /tmp/tiny                 # the real run (one H200, under 10 minutes)
  python3 tools/train_tiny.py --out /tmp/t --steps 20 --tiny  # CPU smoke test (a minute)

Recursive MTP fine-tuning (--finetune-mtp MODEL_DIR): kiln's `mtp` drafter runs the one MTP layer K times per
step (plugins/draft-mtp/mtp_drafter.cpp): step 1 on the target's h_p and t_{p+1}; step k ≥ 2 on the layer's own
previous block output (before shared_head.norm: DraftLayerOutput::hidden) and the previous draft, attending over
the draft KV, whose positions ≤ p hold rows computed from the target's hidden states and p + 1 .. p + k − 1 this
step's recursive rows (dropped afterwards). Joint training taught depth 1 only, so drafts 2..K were rarely right.
This mode loads an export (the trunk frozen: its tensors are copied from the source and checked byte-identical),
and trains only the MTP layer on Σ_k w_k · CE(depth k), k = 1..D (--mtp-depth): for every chain start p of a
window at once, depth k's row p takes depth k−1's block output at row p and the text token t_{p+k}, sits at
position p + k − 1, attends to the depth-1 rows ≤ p and its own chain's rows of depths 2..k (exactly the draft
KV's contents; checked against a step-by-step re-run of the drafter before training) and predicts t_{p+k+1};
gradients flow through the whole unrolled chain. Depth weights w_k ∝ Σ_{m=k}^{D} γ^{m−1} (--depth-gamma,
0.8): the derivative of the expected accepted length Σ_m Π_{j≤m} a_j with respect to depth k's conditional
acceptance a_k when every a_j is γ, because a draft only counts when all earlier ones were accepted; deeper
depths are worth less and depth 1 keeps the largest weight (0.39 / 0.27 / 0.18 / 0.11 / 0.05 at D = 5).
Where training differs from kiln's inference:
  - inputs and targets are the text (teacher forcing); kiln feeds back its own drafts and is judged against the
    target's greedy tokens. For acceptance only drafts after an accepted prefix count, and there the drafts fed
    back are the greedy tokens, so the two agree wherever the trunk's greedy continuation is the text (nearly
    always on the training split, which the trunk has memorised);
  - windows start anywhere in the token stream (mid-document, 256 chain starts); kiln's start at the prompt;
  - bf16 autocast for the trunk's hidden states and the MTP layer; kiln computes in fp32 from the bf16 weights
    with a bf16 (or fp8) draft KV; RoPE positions are offset by one (relative, so the same attention);
  - every chain start weighs the same; kiln drafts from the starts its acceptances lead to;
  - greedy targets only: at temperature > 0 kiln samples drafts from the same logits.
Before and after, it reports per-depth teacher-forced top-1 and CE on the validation split and kiln's metric,
simulated: per-position acceptance at K = D (drafts 1..k all equal the trunk's greedy tokens) over the trunk's
128-token greedy continuations of `kiln ab`'s 8 built-in prompts and of 32 validation prompts. On the model
trained by the joint run it gives 0.944 0.260 0.052 0.010 0.003 for the ab prompts, where `kiln ab` measured
0.95 0.26 0.04 0.01 0.00 (bench/RESULTS.md). Output: the full export (model.safetensors: the source's trunk
tensors and metadata plus the new MTP tensors and a `kiln_finetune_mtp` record; config.json and tokenizer.json
copied), verified as above, plus mtp.safetensors (the MTP tensors alone, ≈ 2.5 MB, with the full tensors'
sha256) from which --merge-mtp rebuilds model.safetensors elsewhere.

  python3 tools/train_tiny.py --finetune-mtp models/tiny-glm --mtp-depth 5 --out /tmp/tiny-mtp  # one H200, < 4 min
  python3 tools/train_tiny.py --finetune-mtp models/tiny-glm --merge-mtp /tmp/tiny-mtp/mtp.safetensors \
      --out models/tiny-glm                                    # rebuild model.safetensors from the MTP file
  python3 tools/train_tiny.py --finetune-mtp /tmp/t --out /tmp/t2 --steps 10 --tiny  # CPU smoke (after the above)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import math
import pkgutil
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.glm4_moe_lite import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM
from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite as glm

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "tests" / "data" / "tokenizer" / "tokenizer.json"
EOS = "<|endoftext|>"
MAX_EXPORT_BYTES = 25 * 1000 * 1000

# Modules never imported for their docstrings: side effects on import, GUI toolkits, test suites, platform-only.
SKIP_MODULES = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "test", "msilib", "winreg", "winsound", "nt", "msvcrt",
}


# ----------------------------------------------------------------------------- corpus


def stdlib_module_names() -> list[str]:
    names = set()
    for name in sorted(sys.stdlib_module_names):
        if name in SKIP_MODULES or name.startswith("_"):
            continue
        names.add(name)
        module = quiet_import(name)
        if module is None or not hasattr(module, "__path__"):
            continue
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            parts = info.name.split(".")[1:]
            if not any(p.startswith("_") or p in ("test", "tests") for p in parts):
                names.add(info.name)
    return sorted(names)


def quiet_import(name: str):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return importlib.import_module(name)
    except Exception:  # a module missing from this Python build (or failing to import) is skipped
        return None


def corpus_documents() -> list[str]:
    docs: list[str] = []
    seen: set[str] = set()

    def add(text: str | None) -> None:
        if text and text not in seen:
            seen.add(text)
            docs.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in stdlib_module_names():
            module = quiet_import(name)
            if module is None:
                continue
            add(inspect.getdoc(module))
            for attr in sorted(dir(module)):
                if attr.startswith("_"):
                    continue
                obj = getattr(module, attr, None)
                if inspect.isclass(obj) and getattr(obj, "__module__", None) == name:
                    add(inspect.getdoc(obj))
                    for key, member in sorted(vars(obj).items()):
                        if key.startswith("_"):
                            continue
                        if isinstance(member, (classmethod, staticmethod)):
                            member = member.__func__
                        if inspect.isfunction(member) or inspect.ismethoddescriptor(member) or isinstance(member, property):
                            add(inspect.getdoc(member))
                elif inspect.isfunction(obj) and getattr(obj, "__module__", None) == name or inspect.isbuiltin(obj):
                    add(inspect.getdoc(obj))
    import pydoc_data.topics

    for key in sorted(pydoc_data.topics.topics):
        add(pydoc_data.topics.topics[key])
    return docs


def token_streams(tokenizer: Tokenizer, docs: list[str], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, len(docs) // 50)
    eos = tokenizer.token_to_id(EOS)

    def stream(indices: list[int]) -> torch.Tensor:
        ids: list[int] = []
        for enc in tokenizer.encode_batch([docs[i] for i in indices], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
        return torch.tensor(ids, dtype=torch.int32)

    return stream(order[n_val:]), stream(order[:n_val])


# ----------------------------------------------------------------------------- model


def model_config(tiny: bool, vocab: int) -> Glm4MoeLiteConfig:
    shape = (
        dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=16, n_routed_experts=4)
        if tiny else
        dict(hidden_size=256, intermediate_size=768, moe_intermediate_size=128, num_hidden_layers=6,
             num_attention_heads=8, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16,
             v_head_dim=32, n_routed_experts=8)
    )
    layers = shape["num_hidden_layers"]
    return Glm4MoeLiteConfig(
        **shape,
        vocab_size=vocab,
        num_key_value_heads=shape["num_attention_heads"],
        n_shared_experts=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        routed_scaling_factor=1.8,
        n_group=1,
        topk_group=1,
        mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        max_position_embeddings=4096,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' Glm4MoeLiteExperts.forward computed for every expert, weighted by the top-k routing weights
    (zero elsewhere): the same function, without data-dependent shapes."""
    weights = torch.zeros(hidden_states.shape[0], self.num_experts, dtype=top_k_weights.dtype,
                          device=hidden_states.device).scatter(1, top_k_index, top_k_weights)
    gate_up = torch.einsum("th,eih->eti", hidden_states, self.gate_up_proj)
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.einsum("eti,ehi->eth", self.act_fn(gate) * up, self.down_proj)
    return torch.einsum("eth,te->th", out, weights.to(out.dtype)).to(hidden_states.dtype)


class MtpLayer(nn.Module):
    """The next-n layer (models.md §MTP). Module names match the checkpoint: enorm, hnorm, eh_proj,
    shared_head.norm, and the decoder block's own (self_attn.*, mlp.*, input_layernorm, ...)."""

    def __init__(self, config: Glm4MoeLiteConfig):
        super().__init__()
        n = config.num_hidden_layers
        block_config = Glm4MoeLiteConfig(**{**config.to_dict(), "num_hidden_layers": n + 1,
                                            "mlp_layer_types": list(config.mlp_layer_types) + ["sparse"]})
        block_config._attn_implementation = config._attn_implementation
        self.config = config
        self.attn_implementation = config._attn_implementation
        self.enorm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.block = glm.Glm4MoeLiteDecoderLayer(block_config, layer_idx=n)
        self.shared_head = nn.Module()
        self.shared_head.norm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, rotary) -> torch.Tensor:
        """embeds: embeddings of t_{i+1}; hidden: the trunk's final-normed h_i; rows at positions i + 1."""
        positions = torch.arange(1, embeds.shape[1] + 1, device=embeds.device)[None]
        out = self.block_output(embeds, hidden, rotary, positions,
                                causal_mask(embeds, self.attn_implementation), cache=None)
        return self.shared_head.norm(out)

    def block_output(self, embeds: torch.Tensor, hidden: torch.Tensor, rotary, positions: torch.Tensor,
                     attention_mask: torch.Tensor | None, cache) -> torch.Tensor:
        """The decoder block's output before shared_head.norm: what kiln's drafter feeds back as the next
        step's hidden (DraftLayerOutput::hidden). `cache` (a DraftKv or None) supplies the keys of earlier rows."""
        z = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        return self.block(z, attention_mask=attention_mask, position_ids=positions,
                          position_embeddings=rotary(z, positions), past_key_values=cache)


def causal_mask(x: torch.Tensor, attn_implementation: str) -> torch.Tensor | None:
    # sdpa treats "no mask" as causal (and then may use its fused kernels); eager needs the additive mask.
    if attn_implementation == "sdpa":
        return None
    t = x.shape[1]
    return torch.full((t, t), torch.finfo(torch.float32).min, device=x.device).triu(1)[None, None]


class Trainer:
    def __init__(self, args, config: Glm4MoeLiteConfig, device: torch.device):
        torch.manual_seed(args.seed)
        self.model = Glm4MoeLiteForCausalLM(config).to(device)
        self.mtp = MtpLayer(config).to(device)
        self.mtp.apply(self.model._init_weights)
        self.args = args
        self.routers = [m for m in list(self.model.modules()) + list(self.mtp.modules())
                        if isinstance(m, glm.Glm4MoeLiteTopkRouter)]
        self.loads: dict[int, torch.Tensor] = {}
        for i, router in enumerate(self.routers):
            router.register_forward_hook(self._count_load(i))
        params = list(self.model.parameters()) + list(self.mtp.parameters())
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")

    def _count_load(self, i: int):
        def hook(module, _inputs, outputs):
            if module.training:
                indices = outputs[2].detach().reshape(-1)
                self.loads[i] = torch.bincount(indices, minlength=module.num_experts)
        return hook

    def losses(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = batch[:, :-1]
        trunk = self.model.model(input_ids=inputs)
        hidden = trunk.last_hidden_state  # after the final norm: what the MTP layer conditions on
        logits = self.model.lm_head(hidden).float()
        main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        # MTP row i (i = 0 .. T−2 of the inputs): h_i and t_{i+1} → t_{i+2}.
        embeds = self.model.model.embed_tokens(batch[:, 1:-1])
        mtp_hidden = self.mtp(embeds, hidden[:, :-1], self.model.model.rotary_emb)
        mtp_logits = self.model.lm_head(mtp_hidden).float()
        mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), batch[:, 2:].reshape(-1))
        return main, mtp

    def step(self, batch: torch.Tensor, lr: float) -> tuple[float, float]:
        self.model.train()
        self.mtp.train()
        for g in self.opt.param_groups:
            g["lr"] = lr
        with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            main, mtp = self.losses(batch)
            loss = main + self.args.mtp_weight * mtp
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.model.parameters()) + list(self.mtp.parameters()), 1.0)
        self.opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3): push biases towards equal load
            for i, router in enumerate(self.routers):
                load = self.loads.get(i)
                if load is not None:
                    router.e_score_correction_bias += self.args.bias_rate * torch.sign(load.float().mean() - load.float())
        return main.detach(), mtp.detach()

    @torch.no_grad()
    def evaluate(self, stream: torch.Tensor, seq_len: int, batches: int) -> dict[str, float]:
        self.model.eval()
        self.mtp.eval()
        device = next(self.model.parameters()).device
        n = (stream.numel() - 1) // (seq_len + 1)
        windows = stream[: n * (seq_len + 1)].view(n, seq_len + 1)[: batches * 8].long().to(device)
        totals = {"val_loss": 0.0, "val_mtp_loss": 0.0, "mtp_top1": 0.0, "mtp_agrees_with_trunk": 0.0}
        count = 0
        for chunk in windows.split(8):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
                main, mtp = self.losses(chunk)
                trunk = self.model(input_ids=chunk[:, :-1]).logits
                hidden = self.model.model(input_ids=chunk[:, :-1]).last_hidden_state
                mtp_logits = self.model.lm_head(
                    self.mtp(self.model.model.embed_tokens(chunk[:, 1:-1]), hidden[:, :-1], self.model.model.rotary_emb))
            mtp_pred = mtp_logits.argmax(-1)
            totals["val_loss"] += float(main)
            totals["val_mtp_loss"] += float(mtp)
            totals["mtp_top1"] += float((mtp_pred == chunk[:, 2:]).float().mean())
            # What greedy MTP drafting at depth 1 is accepted at: MTP row i vs the trunk's argmax at i + 1.
            totals["mtp_agrees_with_trunk"] += float((mtp_pred == trunk[:, 1:].argmax(-1)).float().mean())
            count += 1
        return {k: v / max(count, 1) for k, v in totals.items()}


# ----------------------------------------------------------------------------- recursive MTP fine-tuning

# `kiln ab`'s built-in prompts (apps/kiln/cmd_ab.cpp), tokenized without special tokens as it does.
AB_PROMPTS = ["The socket module provides", "Return a new list", "This module implements", "Raise an exception if",
              "The default value is", "Create a new thread", "Read the file and", "If the argument is"]


class DraftKv:
    """The MTP layer's KV while drafting chains are unrolled over a whole window at once: the MLA latents
    (normed c_kv and rotated k_rope, what kiln's draft KV stores) of every depth run so far, concatenated
    along the sequence, one block of T rows per depth. Duck-types the one Cache method the attention calls."""

    def __init__(self):
        self.latents: list[torch.Tensor] = []
        self.rope_keys: list[torch.Tensor] = []

    def update(self, latent: torch.Tensor, rope_key: torch.Tensor, layer_idx: int):
        self.latents.append(latent)
        self.rope_keys.append(rope_key)
        return torch.cat(self.latents, dim=2), torch.cat(self.rope_keys, dim=2)


def draft_mask(t: int, depth: int, attn_implementation: str, device: torch.device) -> torch.Tensor | None:
    """The keys kiln's draft KV holds for the depth-`depth` row of the chain started at p (DraftKv's layout):
    the depth-1 rows at positions ≤ p (rows the target's hidden states produced) and the chain's own rows of
    depths 2 .. depth − 1 plus itself (positions p + 1 .. p + depth − 1, the recursive rows of this step)."""
    if depth == 1:
        return causal_mask(torch.empty(1, t, device=device), attn_implementation)
    allowed = torch.cat([torch.ones(t, t, dtype=torch.bool, device=device).tril()]
                        + [torch.eye(t, dtype=torch.bool, device=device)] * (depth - 1), dim=1)
    if attn_implementation == "sdpa":
        return allowed[None, None]
    return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


def unroll_drafts(model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, hidden: torch.Tensor, tokens: torch.Tensor,
                  depth: int) -> list[torch.Tensor]:
    """kiln's recursive drafting (plugins/draft-mtp/mtp_drafter.cpp), teacher-forced, for every chain start
    p = 0 .. T−1 of a window at once. hidden [B, T, H]: the trunk's final-normed h_p; tokens [B, T + depth − 1]:
    t_1 .. t_{T+depth−1}. Depth 1: row p = (h_p, t_{p+1}) at position p. Depth k ≥ 2: row p = (the depth-(k−1)
    block output of row p, t_{p+k}) at position p + k − 1, attending as draft_mask says. Positions carry
    forward()'s offset of one (RoPE is relative). Returns every depth's block output [B, T, H] (before
    shared_head.norm); depth k's row p drafts t_{p+k+1}. Gradients flow through the whole unrolled chain."""
    t = hidden.shape[1]
    kv = DraftKv()
    outputs = []
    previous = hidden
    for k in range(1, depth + 1):
        positions = torch.arange(k, t + k, device=hidden.device)[None]
        embeds = model.model.embed_tokens(tokens[:, k - 1: k - 1 + t])
        previous = mtp.block_output(embeds, previous, model.model.rotary_emb, positions,
                                    draft_mask(t, k, mtp.attn_implementation, hidden.device), kv)
        outputs.append(previous)
    return outputs


def draft_logits(model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, block_output: torch.Tensor) -> torch.Tensor:
    return model.lm_head(mtp.shared_head.norm(block_output)).float()


@torch.no_grad()
def check_unroll_matches_drafter(model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, ids: torch.Tensor, depth: int) -> float:
    """unroll_drafts equals kiln's drafter run step by step: for a chain start p, the depth-1 rows 0 .. p, then
    one row per further depth appended to the rows before it and the block run causally over all of them (a
    one-layer block over the rows so far is what its KV cache computes), feeding back the last block output."""
    t = ids.numel() - depth
    ids = ids[None].long()
    hidden = model.model(input_ids=ids[:, :t]).last_hidden_state
    unrolled = unroll_drafts(model, mtp, hidden, ids[:, 1:t + depth], depth)
    rotary = model.model.rotary_emb
    worst = 0.0
    for p in sorted({0, t // 2, t - 1}):
        rows_hidden, rows_tokens = hidden[:, :p + 1], ids[:, 1:p + 2]
        positions = torch.arange(1, p + 2, device=ids.device)
        for k in range(1, depth + 1):
            if k > 1:
                rows_hidden = torch.cat([rows_hidden, out[:, -1:]], dim=1)
                rows_tokens = torch.cat([rows_tokens, ids[:, p + k: p + k + 1]], dim=1)
                positions = torch.cat([positions, positions[-1:] + 1])
            embeds = model.model.embed_tokens(rows_tokens)
            out = mtp.block_output(embeds, rows_hidden, rotary, positions[None],
                                   causal_mask(embeds, mtp.attn_implementation), cache=None)
            expected, got = out[0, -1], unrolled[k - 1][0, p]
            worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    if worst > 1e-4:
        raise SystemExit(f"the unrolled drafting chains disagree with step-by-step drafting: rel err {worst:.3g}")
    return worst


def depth_weights(depth: int, gamma: float) -> torch.Tensor:
    """w_k ∝ ∂E/∂a_k, where E = Σ_{m ≤ D} Π_{j ≤ m} a_j is the expected number of accepted drafts at K = D and
    a_j depth j's conditional acceptance, all taken as γ: w_k ∝ Σ_{m=k}^{D} γ^{m−1}. A draft at depth k only
    counts when every earlier one was accepted, so deeper depths are worth less; depth 1 (already ≈ 95 %)
    keeps the largest weight. Normalised to sum 1."""
    w = torch.tensor([sum(gamma ** (m - 1) for m in range(k, depth + 1)) for k in range(1, depth + 1)])
    return w / w.sum()


def rounded_like_export(mtp: MtpLayer) -> MtpLayer:
    """A float copy holding the weights as exported: bf16-rounded, router bias fp32."""
    copied = MtpLayer(mtp.config).eval()
    copied.load_state_dict({k: v.detach().cpu().float() if k.endswith("e_score_correction_bias")
                            else v.detach().cpu().to(torch.bfloat16).float() for k, v in mtp.state_dict().items()})
    return copied


class MtpFinetuner:
    """Trains the MTP layer alone on the unrolled loss Σ_k w_k · CE(depth k row p → t_{p+k+1}); the trunk is
    frozen (its weights are never handed to the optimiser)."""

    def __init__(self, args, model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, device: torch.device):
        self.model = model.to(device).eval().requires_grad_(False)
        self.mtp = mtp.to(device)
        self.args = args
        self.weights = depth_weights(args.mtp_depth, args.depth_gamma).to(device)
        self.router = self.mtp.block.mlp.gate
        self.load: torch.Tensor | None = None
        self.router.register_forward_hook(self._count_load)
        params = list(self.mtp.parameters())
        self.opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
                                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                     lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")

    def _count_load(self, module, _inputs, outputs):
        if module.training:  # summed over the depths: every row of the chain routes through this router
            load = torch.bincount(outputs[2].detach().reshape(-1), minlength=module.num_experts)
            self.load = load if self.load is None else self.load + load

    def losses(self, windows: torch.Tensor) -> torch.Tensor:
        """windows [B, T + D + 1] → per-depth CE [D]."""
        depth = self.args.mtp_depth
        t = windows.shape[1] - depth - 1
        with torch.no_grad():
            hidden = self.model.model(input_ids=windows[:, :t]).last_hidden_state
        outputs = unroll_drafts(self.model, self.mtp, hidden, windows[:, 1:t + depth], depth)
        losses = []
        for k, out in enumerate(outputs, start=1):
            logits = draft_logits(self.model, self.mtp, out)
            losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, k + 1:k + 1 + t].reshape(-1)))
        return torch.stack(losses)

    def step(self, windows: torch.Tensor, lr: float) -> torch.Tensor:
        self.mtp.train()
        for g in self.opt.param_groups:
            g["lr"] = lr
        with torch.autocast(windows.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            per_depth = self.losses(windows)
            loss = (self.weights * per_depth).sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.mtp.parameters(), 1.0)
        self.opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing, as in the joint training
            if self.load is not None:
                load = self.load.float()
                self.router.e_score_correction_bias += self.args.bias_rate * torch.sign(load.mean() - load)
            self.load = None
        return per_depth.detach()


@torch.no_grad()
def greedy_continuations(model: Glm4MoeLiteForCausalLM, prompts: list[list[int]], new_tokens: int,
                         device: torch.device) -> list[tuple[torch.Tensor, int]]:
    """The trunk's greedy continuation of every prompt (no stop tokens), recomputing the whole sequence each
    token; prompts of equal length run as one batch. Returns (prompt + continuation, prompt length) pairs."""
    by_length: dict[int, list[list[int]]] = {}
    for prompt in prompts:
        by_length.setdefault(len(prompt), []).append(prompt)
    sequences = []
    for length, group in sorted(by_length.items()):
        ids = torch.tensor(group, dtype=torch.long, device=device)
        for _ in range(new_tokens):
            ids = torch.cat([ids, model(input_ids=ids, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)], 1)
        sequences += [(row, length) for row in ids]
    return sequences


@torch.no_grad()
def simulated_acceptance(model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, sequences: list[tuple[torch.Tensor, int]],
                         depth: int) -> list[float]:
    """What kiln measures under greedy decoding at K = depth: the fraction of drafting steps whose drafts 1 .. k
    all equal the target's greedy tokens, for k = 1 .. depth. A draft counts only when every earlier one was
    right, and then the recursive drafter has fed back exactly the greedy tokens: teacher forcing with them
    reproduces every draft that matters. Averaged over every chain start in the generated part (the last
    prompt position on; kiln drafts from the starts its acceptances lead to)."""
    accepted, steps = torch.zeros(depth), 0
    by_length: dict[tuple[int, int], list[torch.Tensor]] = {}
    for seq, prompt_length in sequences:
        by_length.setdefault((seq.numel(), prompt_length), []).append(seq)
    for (n, prompt_length), group in by_length.items():
        ids = torch.stack(group)
        t = n - depth - 1
        hidden = model.model(input_ids=ids[:, :t]).last_hidden_state
        outputs = unroll_drafts(model, mtp, hidden, ids[:, 1:t + depth], depth)
        right = torch.stack([draft_logits(model, mtp, out).argmax(-1) == ids[:, k + 1:k + 1 + t]
                             for k, out in enumerate(outputs, start=1)])  # [depth, B, t]
        prefix = right.int().cumprod(0)[:, :, prompt_length - 1:]
        accepted += prefix.sum((1, 2)).float().cpu()
        steps += prefix[0].numel()
    return (accepted / max(steps, 1)).tolist()


@torch.no_grad()
def depth_accuracy(model: Glm4MoeLiteForCausalLM, mtp: MtpLayer, stream: torch.Tensor, seq_len: int, depth: int,
                   max_windows: int) -> tuple[list[float], list[float]]:
    """Teacher-forced per-depth top-1 (depth k row p vs the text's t_{p+k+1}) and CE over non-overlapping
    windows of `stream`."""
    device = next(model.parameters()).device
    width = seq_len + depth + 1
    n = min(stream.numel() // width, max_windows)
    windows = stream[: n * width].view(n, width).long().to(device)
    t = seq_len
    top1, loss = torch.zeros(depth), torch.zeros(depth)
    for chunk in windows.split(8):
        hidden = model.model(input_ids=chunk[:, :t]).last_hidden_state
        for k, out in enumerate(unroll_drafts(model, mtp, hidden, chunk[:, 1:t + depth], depth), start=1):
            logits, target = draft_logits(model, mtp, out), chunk[:, k + 1:k + 1 + t]
            top1[k - 1] += float((logits.argmax(-1) == target).float().sum())
            loss[k - 1] += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"))
    count = max(n * t, 1)
    return (top1 / count).tolist(), (loss / count).tolist()


def drafting_report(model, mtp, val_ids, sequences: dict[str, list], depth: int, tiny: bool) -> dict[str, list[float]]:
    top1, loss = depth_accuracy(model, mtp, val_ids, 32 if tiny else 256, depth, 4 if tiny else 64)
    report = {"val_depth_top1": top1, "val_depth_loss": loss}
    for name, seqs in sequences.items():
        report[f"accept_{name}"] = simulated_acceptance(model, mtp, seqs, depth)
    return report


def print_report(label: str, report: dict[str, list[float]]) -> None:
    print(f"{label}:")
    for key, values in report.items():
        extra = f"   mean acceptance length {1 + sum(values):.2f}" if key.startswith("accept_") else ""
        print(f"  {key:24s} " + " ".join(f"{v:.3f}" for v in values) + extra)


def load_export(path: Path) -> tuple[Glm4MoeLiteForCausalLM, MtpLayer]:
    """An exported model as fp32 modules holding its bf16 values (router biases fp32): the trunk through
    transformers, the MTP block through transformers too (as layer N of an (N+1)-layer model, so its per-expert
    tensors are fused back the way transformers fuses a trunk MoE layer's), enorm / hnorm / eh_proj /
    shared_head.norm by name."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # both loads list the tensors they ignore, as expected
    model = Glm4MoeLiteForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = model.config
    n = config.num_hidden_layers
    bigger = Glm4MoeLiteConfig(**{**config.to_dict(), "num_hidden_layers": n + 1,
                                  "mlp_layer_types": list(config.mlp_layer_types) + ["sparse"]})
    donor = Glm4MoeLiteForCausalLM.from_pretrained(path, config=bigger, dtype=torch.float32)
    transformers.logging.set_verbosity(verbosity)
    config._attn_implementation = "sdpa"
    mtp = MtpLayer(config)
    mtp.block.load_state_dict(donor.model.layers[n].state_dict())
    tensors = load_file(str(path / "model.safetensors"))
    for name, module in (("enorm", mtp.enorm), ("hnorm", mtp.hnorm), ("eh_proj", mtp.eh_proj),
                         ("shared_head.norm", mtp.shared_head.norm)):
        module.weight.data.copy_(tensors[f"model.layers.{n}.{name}.weight"].float())
    return model, mtp


def assert_same_tensors(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], what: str,
                        compare_bytes: bool = True) -> None:
    """Same names, dtypes, shapes and (unless told otherwise) bytes."""
    if set(expected) != set(got):
        raise SystemExit(f"{what}: tensor names differ: missing {sorted(set(expected) - set(got))[:5]}, "
                         f"extra {sorted(set(got) - set(expected))[:5]}")
    for name, e in expected.items():
        g = got[name]
        if e.dtype != g.dtype or e.shape != g.shape or compare_bytes and not torch.equal(
                e.contiguous().reshape(-1).view(torch.uint8), g.contiguous().reshape(-1).view(torch.uint8)):
            raise SystemExit(f"{what}: {name} differs ({e.dtype} {list(e.shape)} vs {g.dtype} {list(g.shape)})")


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes (in name order): identifies a checkpoint's
    contents whatever order safetensors writes its header in."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_finetuned(source: Path, mtp: dict[str, torch.Tensor], out: Path, info: dict) -> str:
    """`source`'s model.safetensors with its MTP tensors replaced by `mtp`, every trunk tensor checked
    byte-identical to the source before writing (and again as written); config.json and tokenizer.json copied.
    Returns the written tensors' digest."""
    n = json.loads((source / "config.json").read_text())["num_hidden_layers"]
    prefix = f"model.layers.{n}."
    with safe_open(str(source / "model.safetensors"), "pt") as f:
        metadata = dict(f.metadata() or {})
    src = load_file(str(source / "model.safetensors"))
    assert_same_tensors({k: v for k, v in src.items() if k.startswith(prefix)}, mtp, "MTP layer", compare_bytes=False)
    tensors = {k: mtp[k] if k.startswith(prefix) else v for k, v in src.items()}
    trunk = {k: v for k, v in src.items() if not k.startswith(prefix)}
    assert_same_tensors(trunk, {k: v for k, v in tensors.items() if not k.startswith(prefix)}, "trunk before writing")
    metadata["kiln_finetune_mtp"] = json.dumps(info)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
    for name in ("config.json", "tokenizer.json"):
        if (out / name).resolve() != (source / name).resolve():
            shutil.copyfile(source / name, out / name)
    written = load_file(str(out / "model.safetensors"))
    assert_same_tensors(trunk, {k: v for k, v in written.items() if not k.startswith(prefix)}, "trunk as written")
    print(f"exported {out}: model.safetensors {(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB; "
          f"all {len(trunk)} trunk tensors byte-identical to {source}")
    return tensor_digest(written)


# ----------------------------------------------------------------------------- export


def mtp_tensors(mtp: MtpLayer, config: Glm4MoeLiteConfig) -> dict[str, torch.Tensor]:
    """The MTP layer under the checkpoint names: the decoder block is saved as layer N of an (N+1)-layer donor
    model by transformers itself, so its names and per-expert layout are exactly a trunk MoE layer's."""
    n = config.num_hidden_layers
    bigger = Glm4MoeLiteConfig(**{**config.to_dict(), "num_hidden_layers": n + 1,
                                  "mlp_layer_types": list(config.mlp_layer_types) + ["sparse"]})
    donor = Glm4MoeLiteForCausalLM(bigger)
    donor.model.layers[n].load_state_dict({k: v.detach().cpu().float() for k, v in mtp.block.state_dict().items()})
    prefix = f"model.layers.{n}."
    with tempfile.TemporaryDirectory() as tmp:
        donor.to(torch.bfloat16).save_pretrained(tmp)
        saved = load_file(str(Path(tmp) / "model.safetensors"))
    tensors = {k: v.contiguous() for k, v in saved.items() if k.startswith(prefix)}
    for name, module in (("enorm", mtp.enorm), ("hnorm", mtp.hnorm),
                         ("eh_proj", mtp.eh_proj), ("shared_head.norm", mtp.shared_head.norm)):
        tensors[f"{prefix}{name}.weight"] = module.weight.detach().cpu().to(torch.bfloat16).contiguous()
    # transformers keeps the router bias in fp32 (_keep_in_fp32_modules_strict); so do we.
    tensors[f"{prefix}mlp.gate.e_score_correction_bias"] = (
        mtp.block.mlp.gate.e_score_correction_bias.detach().cpu().float().contiguous())
    return tensors


def export(trainer: Trainer, config: Glm4MoeLiteConfig, out: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        (out / stale).unlink(missing_ok=True)
    trunk = Glm4MoeLiteForCausalLM(config)
    trunk.load_state_dict({k: v.detach().cpu().float() for k, v in trainer.model.state_dict().items()})
    trunk.to(torch.bfloat16).save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)

    tensors = load_file(str(out / "model.safetensors"))
    # transformers keeps router biases in fp32 when it loads bf16 (_keep_in_fp32_modules_strict): store them so.
    for name, value in trainer.model.state_dict().items():
        if name.endswith("e_score_correction_bias"):
            tensors[name] = value.detach().cpu().float().contiguous()
    tensors.update(mtp_tensors(trainer.mtp, config))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "kiln_train_tiny": json.dumps(info)})

    cfg = json.loads((out / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    cfg["first_k_dense_replace"] = config.mlp_layer_types.index("sparse")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(TOKENIZER, out / "tokenizer.json")

    size = (out / "model.safetensors").stat().st_size
    print(f"exported {out}: model.safetensors {size / 1e6:.2f} MB ({len(tensors)} tensors)")
    if size > MAX_EXPORT_BYTES:
        raise SystemExit(f"model.safetensors is {size / 1e6:.2f} MB, over the {MAX_EXPORT_BYTES / 1e6:.0f} MB budget")


@torch.no_grad()
def verify_export(model: Glm4MoeLiteForCausalLM, mtp_layer: MtpLayer, out: Path, sample: torch.Tensor) -> None:
    """transformers loads the trunk (ignoring the MTP tensors) and reproduces the trained model's logits up to
    the bf16 rounding of the weights."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # it lists the MTP tensors it ignores, as expected
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    transformers.logging.set_verbosity(verbosity)
    ids = sample[None, :64].long()
    ours = Glm4MoeLiteForCausalLM(model.config)
    ours.load_state_dict({k: v.detach().cpu().float() if k.endswith("e_score_correction_bias")
                          else v.detach().cpu().to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    ours.eval()
    a, b = reloaded(input_ids=ids).logits, ours(input_ids=ids).logits
    err = float((a - b).abs().max() / b.abs().max())
    if err > 1e-4:
        raise SystemExit(f"transformers' reload of {out} disagrees with the trained trunk: rel err {err:.3g}")
    # The exported MTP layer, read back by name through make_reference.py's MTP reference (the one kiln's C++
    # MTP layer is tested against), equals the trained MTP module with bf16-rounded weights.
    from make_reference import mtp_logits as reference_mtp_logits

    hidden = reloaded.model(input_ids=ids).last_hidden_state
    expected = reference_mtp_logits(reloaded, out, ids[0], hidden[0])
    mtp = rounded_like_export(mtp_layer).cpu()
    got = reloaded.lm_head(mtp(reloaded.model.embed_tokens(ids[:, 1:]), hidden[:, :-1], reloaded.model.rotary_emb))[0]
    mtp_err = float((got - expected).abs().max() / expected.abs().max())
    if mtp_err > 1e-4:
        raise SystemExit(f"the exported MTP layer disagrees with the trained one: rel err {mtp_err:.3g}")
    print(f"verified: transformers reloads the trunk (rel err {err:.2g} vs the bf16-rounded weights); the MTP layer "
          f"read back from model.layers.{model.config.num_hidden_layers}.* matches (rel err {mtp_err:.2g})")


# ----------------------------------------------------------------------------- main

# Defaults that differ between training the whole model and fine-tuning the MTP layer (--finetune-mtp).
DEFAULTS = {
    "train": dict(steps=20000, max_minutes=7.5, batch=64, seq_len=512, lr=2e-3, warmup=200),
    "finetune": dict(steps=20000, max_minutes=2.25, batch=64, seq_len=256, lr=1e-3, warmup=50),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output directory (HF layout)")
    ap.add_argument("--finetune-mtp", type=Path, metavar="MODEL_DIR",
                    help="fine-tune only the MTP layer of this exported model on the unrolled loss (trunk frozen)")
    ap.add_argument("--mtp-depth", type=int, default=5, help="--finetune-mtp: depths D of the unrolled loss")
    ap.add_argument("--depth-gamma", type=float, default=0.8,
                    help="--finetune-mtp: assumed per-depth acceptance γ behind the depth weights")
    ap.add_argument("--merge-mtp", type=Path, metavar="MTP_FILE",
                    help="with --finetune-mtp SRC: write SRC with the MTP tensors of MTP_FILE (a fine-tune's "
                         "mtp.safetensors) to --out and check them against the digest that run recorded")
    ap.add_argument("--steps", type=int, help="at most this many steps (default 20000)")
    ap.add_argument("--max-minutes", type=float,
                    help="training time budget: the schedule ends at the budget or the step count, whichever "
                         "first (default 7.5; --finetune-mtp 2.25)")
    ap.add_argument("--batch", type=int, help="sequences per step (default 64)")
    ap.add_argument("--seq-len", type=int, help="tokens per sequence (default 512; --finetune-mtp 256 chain starts)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default 2e-3; --finetune-mtp 1e-3)")
    ap.add_argument("--warmup", type=int, help="warmup steps (default 200; --finetune-mtp 50)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the MTP loss")
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="router bias update per step (load balancing)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tiny", action="store_true",
                    help="a minute-sized model for CPU smoke tests (--finetune-mtp: small batches and evaluation)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32 (default: bf16 autocast)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (optional)")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    if args.merge_mtp and not args.finetune_mtp:
        ap.error("--merge-mtp needs --finetune-mtp SRC (the model whose trunk it goes with)")
    if args.finetune_mtp and args.compile:
        ap.error("--compile applies to the joint training only")
    for key, value in DEFAULTS["finetune" if args.finetune_mtp else "train"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tiny:
        args.batch, args.seq_len = min(args.batch, 8), min(args.seq_len, 64 if args.finetune_mtp else 128)
    return args


def load_corpus(args, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    t0 = time.time()
    docs = corpus_documents()
    train_ids, val_ids = token_streams(tokenizer, docs, args.seed)
    print(f"corpus: {len(docs)} documents, {sum(map(len, docs)) / 1e6:.2f} M chars -> {train_ids.numel()} train / "
          f"{val_ids.numel()} validation tokens ({time.time() - t0:.1f} s)")
    return train_ids, val_ids


def learning_rate(args, step: int, elapsed: float) -> tuple[float, float]:
    """Warmup, then cosine decay to 10 % over whichever ends first, the step count or the time budget (so a run
    cut by the budget still finishes its decay). Returns (lr, progress)."""
    progress = min(1.0, max(step / args.steps, elapsed / (args.max_minutes * 60)))
    warmup = max(1, min(args.warmup, args.steps // 10))
    return args.lr * min(1.0, step / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))), progress


def random_windows(stream: torch.Tensor, gen: torch.Generator, batch: int, width: int) -> torch.Tensor:
    offsets = torch.randint(0, stream.numel() - width, (batch,), generator=gen).to(stream.device)
    return stream[offsets[:, None] + torch.arange(width, device=stream.device)[None]].long()


def train_main(args, device: torch.device, tokenizer: Tokenizer, t0: float) -> int:
    train_ids, val_ids = load_corpus(args, tokenizer)
    config = model_config(args.tiny, tokenizer.get_vocab_size())
    config._attn_implementation = "sdpa"
    trainer = Trainer(args, config, device)
    n_trunk = sum(p.numel() for p in trainer.model.parameters())
    n_mtp = sum(p.numel() for p in trainer.mtp.parameters())
    print(f"model: {n_trunk / 1e6:.2f} M trunk + {n_mtp / 1e6:.2f} M MTP parameters "
          f"(~{2 * (n_trunk + n_mtp) / 1e6:.1f} MB in bf16); device {device}, bf16 autocast {args.bf16}")
    if args.compile:
        trainer.losses = torch.compile(trainer.losses)

    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train_ids.to(device)
    tokens_per_step = args.batch * args.seq_len
    start = time.time()
    step = 0
    for step in range(1, args.steps + 1):
        batch = random_windows(train_dev, gen, args.batch, args.seq_len + 1)
        lr, progress = learning_rate(args, step, time.time() - start)
        main_loss, mtp_loss = trainer.step(batch, lr)
        elapsed = time.time() - start
        if step % args.log_every == 0 or step == args.steps or step == 1:
            rate = step / elapsed
            print(f"step {step:6d}  loss {float(main_loss):.3f}  mtp {float(mtp_loss):.3f}  lr {lr:.2e}  "
                  f"{rate:.2f} steps/s  {rate * tokens_per_step / 1e3:.1f} k tok/s  {elapsed:.0f} s", flush=True)
        if progress >= 1.0 and step < args.steps:
            print(f"stopping at step {step}: the {args.max_minutes} minute budget is spent")
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - start
    print(f"trained {step} steps in {train_seconds:.1f} s: {step / train_seconds:.2f} steps/s, "
          f"{step * tokens_per_step / train_seconds / 1e3:.1f} k tokens/s")

    metrics = trainer.evaluate(val_ids, min(args.seq_len, 256), batches=2 if args.tiny else 8)
    print("validation: " + "  ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
    info = {"steps": step, "train_seconds": round(train_seconds, 1), "tokens_seen": step * tokens_per_step,
            "corpus_tokens": int(train_ids.numel()), "seed": args.seed, "torch": torch.__version__,
            **{k: round(v, 4) for k, v in metrics.items()}}
    trainer.model.cpu()
    trainer.mtp.cpu()
    export(trainer, config, args.out, info)
    verify_export(trainer.model, trainer.mtp, args.out, val_ids)
    print(f"total {time.time() - t0:.1f} s")
    return 0


def finetune_main(args, device: torch.device, tokenizer: Tokenizer, t0: float) -> int:
    source, depth = args.finetune_mtp, args.mtp_depth
    train_ids, val_ids = load_corpus(args, tokenizer)  # the same seeded split as the joint training's
    model, mtp = load_export(source)
    config = model.config
    prefix = f"model.layers.{config.num_hidden_layers}."
    assert_same_tensors({k: v for k, v in load_file(str(source / "model.safetensors")).items() if k.startswith(prefix)},
                        mtp_tensors(mtp, config), f"the MTP layer of {source} loaded and exported again")
    err = check_unroll_matches_drafter(model, mtp, val_ids[: 24 + depth], depth)
    weights = depth_weights(depth, args.depth_gamma)
    print(f"fine-tuning the MTP layer of {source} ({sum(p.numel() for p in mtp.parameters()) / 1e6:.2f} M "
          f"parameters; the trunk frozen) on depths 1..{depth}, weights "
          + " ".join(f"{w:.3f}" for w in weights.tolist())
          + f"; unrolled chains = step-by-step drafting (rel err {err:.1g}); device {device}, bf16 autocast {args.bf16}")

    model.to(device).eval()
    new_tokens, n_val = (16, 4) if args.tiny else (128, 32)
    stride = val_ids.numel() // n_val
    prompts = {"ab_prompts": [tokenizer.encode(p, add_special_tokens=False).ids for p in AB_PROMPTS],
               "val_prompts": [val_ids[i * stride:i * stride + 16].tolist() for i in range(n_val)]}
    sequences = {name: greedy_continuations(model, p, new_tokens, device) for name, p in prompts.items()}
    print(f"greedy continuations: {len(AB_PROMPTS)} kiln-ab prompts and {n_val} 16-token validation prompts, "
          f"{new_tokens} tokens each ({time.time() - t0:.1f} s)")
    val_dev = val_ids.to(device)
    before = drafting_report(model, rounded_like_export(mtp).to(device), val_dev, sequences, depth, args.tiny)
    print_report("before (per depth / per position k = 1.." + str(depth) + ")", before)

    tuner = MtpFinetuner(args, model, mtp, device)
    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train_ids.to(device)
    start = time.time()
    step = 0
    for step in range(1, args.steps + 1):
        windows = random_windows(train_dev, gen, args.batch, args.seq_len + depth + 1)
        lr, progress = learning_rate(args, step, time.time() - start)
        per_depth = tuner.step(windows, lr)
        elapsed = time.time() - start
        if step % args.log_every == 0 or step == args.steps or step == 1:
            print(f"step {step:6d}  loss " + " ".join(f"{v:.3f}" for v in per_depth.tolist())
                  + f"  lr {lr:.2e}  {step / elapsed:.2f} steps/s  {elapsed:.0f} s", flush=True)
        if progress >= 1.0 and step < args.steps:
            print(f"stopping at step {step}: the {args.max_minutes} minute budget is spent")
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - start
    print(f"trained {step} steps in {train_seconds:.1f} s: {step / train_seconds:.2f} steps/s")

    tuned = rounded_like_export(mtp).to(device)
    after = drafting_report(model, tuned, val_dev, sequences, depth, args.tiny)
    print_report("after", after)
    info = {"source": str(source), "depth": depth, "depth_weights": [round(w, 4) for w in weights.tolist()],
            "steps": step, "train_seconds": round(train_seconds, 1), "batch": args.batch, "seq_len": args.seq_len,
            "lr": args.lr, "seed": args.seed, "torch": torch.__version__,
            "before": {k: [round(v, 4) for v in vs] for k, vs in before.items()},
            "after": {k: [round(v, 4) for v in vs] for k, vs in after.items()}}
    model.cpu()
    mtp.cpu()
    new_mtp = mtp_tensors(mtp, config)
    digest = write_finetuned(source, new_mtp, args.out, info)
    verify_export(model, mtp, args.out, val_ids)
    save_file(new_mtp, str(args.out / "mtp.safetensors"),
              metadata={"format": "pt", "kiln_finetune_mtp": json.dumps(info), "tensors_sha256": digest})
    print(f"wrote {args.out / 'mtp.safetensors'} ({(args.out / 'mtp.safetensors').stat().st_size / 1e6:.2f} MB, "
          f"the MTP tensors alone); model tensors sha256 {digest}")
    print(f"total {time.time() - t0:.1f} s")
    return 0


def merge_main(args, tokenizer: Tokenizer) -> int:
    """Rebuilds a fine-tune's model.safetensors from its mtp.safetensors and the source model (whose trunk it
    was trained against), checking the result against the digest the fine-tune recorded."""
    with safe_open(str(args.merge_mtp), "pt") as f:
        metadata = f.metadata()
    digest = write_finetuned(args.finetune_mtp, load_file(str(args.merge_mtp)), args.out,
                             json.loads(metadata["kiln_finetune_mtp"]))
    if digest != metadata["tensors_sha256"]:
        raise SystemExit(f"merged tensors sha256 {digest} differs from the fine-tune's {metadata['tensors_sha256']}")
    model, mtp = load_export(args.out)
    verify_export(model, mtp, args.out, torch.tensor(tokenizer.encode(" ".join(AB_PROMPTS)).ids))
    print(f"merged: model tensors sha256 {digest} = the fine-tune's")
    return 0


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    glm.Glm4MoeLiteExperts.forward = dense_experts_forward
    if args.merge_mtp:
        return merge_main(args, tokenizer)
    if args.finetune_mtp:
        return finetune_main(args, device, tokenizer, t0)
    return train_main(args, device, tokenizer, t0)


if __name__ == "__main__":
    sys.exit(main())
