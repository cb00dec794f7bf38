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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
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
        self.attn_implementation = config._attn_implementation
        self.enorm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.block = glm.Glm4MoeLiteDecoderLayer(block_config, layer_idx=n)
        self.shared_head = nn.Module()
        self.shared_head.norm = glm.Glm4MoeLiteRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, rotary) -> torch.Tensor:
        """embeds: embeddings of t_{i+1}; hidden: the trunk's final-normed h_i; rows at positions i + 1."""
        z = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        positions = torch.arange(1, z.shape[1] + 1, device=z.device)[None]
        out = self.block(z, attention_mask=causal_mask(z, self.attn_implementation), position_ids=positions,
                         position_embeddings=rotary(z, positions))
        return self.shared_head.norm(out)


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


# ----------------------------------------------------------------------------- export


def mtp_tensors(trainer: Trainer, config: Glm4MoeLiteConfig) -> dict[str, torch.Tensor]:
    """The MTP layer under the checkpoint names: the decoder block is saved as layer N of an (N+1)-layer donor
    model by transformers itself, so its names and per-expert layout are exactly a trunk MoE layer's."""
    n = config.num_hidden_layers
    bigger = Glm4MoeLiteConfig(**{**config.to_dict(), "num_hidden_layers": n + 1,
                                  "mlp_layer_types": list(config.mlp_layer_types) + ["sparse"]})
    donor = Glm4MoeLiteForCausalLM(bigger)
    donor.model.layers[n].load_state_dict({k: v.detach().cpu().float() for k, v in trainer.mtp.block.state_dict().items()})
    prefix = f"model.layers.{n}."
    with tempfile.TemporaryDirectory() as tmp:
        donor.to(torch.bfloat16).save_pretrained(tmp)
        saved = load_file(str(Path(tmp) / "model.safetensors"))
    tensors = {k: v.contiguous() for k, v in saved.items() if k.startswith(prefix)}
    for name, module in (("enorm", trainer.mtp.enorm), ("hnorm", trainer.mtp.hnorm),
                         ("eh_proj", trainer.mtp.eh_proj), ("shared_head.norm", trainer.mtp.shared_head.norm)):
        tensors[f"{prefix}{name}.weight"] = module.weight.detach().cpu().to(torch.bfloat16).contiguous()
    # transformers keeps the router bias in fp32 (_keep_in_fp32_modules_strict); so do we.
    tensors[f"{prefix}mlp.gate.e_score_correction_bias"] = (
        trainer.mtp.block.mlp.gate.e_score_correction_bias.detach().cpu().float().contiguous())
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
    tensors.update(mtp_tensors(trainer, config))
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
def verify_export(trainer: Trainer, out: Path, sample: torch.Tensor) -> None:
    """transformers loads the trunk (ignoring the MTP tensors) and reproduces the trained model's logits up to
    the bf16 rounding of the weights."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # it lists the MTP tensors it ignores, as expected
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    transformers.logging.set_verbosity(verbosity)
    ids = sample[None, :64].long()
    ours = Glm4MoeLiteForCausalLM(trainer.model.config)
    ours.load_state_dict({k: v.detach().cpu().float() if k.endswith("e_score_correction_bias")
                          else v.detach().cpu().to(torch.bfloat16).float() for k, v in trainer.model.state_dict().items()})
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
    mtp = copy.deepcopy(trainer.mtp).float().eval()
    mtp.load_state_dict({k: v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16).float()
                         for k, v in mtp.state_dict().items()})
    got = reloaded.lm_head(mtp(reloaded.model.embed_tokens(ids[:, 1:]), hidden[:, :-1], reloaded.model.rotary_emb))[0]
    mtp_err = float((got - expected).abs().max() / expected.abs().max())
    if mtp_err > 1e-4:
        raise SystemExit(f"the exported MTP layer disagrees with the trained one: rel err {mtp_err:.3g}")
    print(f"verified: transformers reloads the trunk (rel err {err:.2g} vs the bf16-rounded weights); the MTP layer "
          f"read back from model.layers.{trainer.model.config.num_hidden_layers}.* matches (rel err {mtp_err:.2g})")


# ----------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output directory (HF layout)")
    ap.add_argument("--steps", type=int, default=20000, help="at most this many steps")
    ap.add_argument("--max-minutes", type=float, default=7.5,
                    help="training time budget: the schedule ends at the budget or the step count, whichever first")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the MTP loss")
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="router bias update per step (load balancing)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tiny", action="store_true", help="a minute-sized model for CPU smoke tests")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32 (default: bf16 autocast)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (optional)")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    if args.tiny:
        args.batch, args.seq_len = min(args.batch, 8), min(args.seq_len, 128)

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    docs = corpus_documents()
    train_ids, val_ids = token_streams(tokenizer, docs, args.seed)
    print(f"corpus: {len(docs)} documents, {sum(map(len, docs)) / 1e6:.2f} M chars -> {train_ids.numel()} train / "
          f"{val_ids.numel()} validation tokens ({time.time() - t0:.1f} s)")

    config = model_config(args.tiny, tokenizer.get_vocab_size())
    config._attn_implementation = "sdpa"
    glm.Glm4MoeLiteExperts.forward = dense_experts_forward
    trainer = Trainer(args, config, device)
    n_trunk = sum(p.numel() for p in trainer.model.parameters())
    n_mtp = sum(p.numel() for p in trainer.mtp.parameters())
    print(f"model: {n_trunk / 1e6:.2f} M trunk + {n_mtp / 1e6:.2f} M MTP parameters "
          f"(~{2 * (n_trunk + n_mtp) / 1e6:.1f} MB in bf16); device {device}, bf16 autocast {args.bf16}")
    if args.compile:
        trainer.losses = torch.compile(trainer.losses)

    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train_ids.to(device)
    window = args.seq_len + 1
    tokens_per_step = args.batch * args.seq_len
    start = time.time()
    step = 0
    for step in range(1, args.steps + 1):
        offsets = torch.randint(0, train_ids.numel() - window, (args.batch,), generator=gen).to(device)
        batch = train_dev[offsets[:, None] + torch.arange(window, device=device)[None]].long()
        # The schedule runs to whichever ends first, the step count or the time budget, so a run cut by the
        # budget still finishes its learning-rate decay.
        elapsed = time.time() - start
        progress = min(1.0, max(step / args.steps, elapsed / (args.max_minutes * 60)))
        warmup = max(1, min(args.warmup, args.steps // 10))
        lr = args.lr * min(1.0, step / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
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
    verify_export(trainer, args.out, val_ids)
    print(f"total {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
