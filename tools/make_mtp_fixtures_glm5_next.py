#!/usr/bin/env python3
"""Add a next-n (MTP) layer to copies of the glm5_next fixtures (tests/data/models/glm5_next-mtp-*).

transformers does not model glm5_next's MTP layer (`layers.<num_hidden_layers>.*`, `shared_head`), so there is
no reference output to dump: these fixtures are for lossless drafting (greedy output with the `mtp` drafter
equals greedy output without it) and for the loader. Each one is a source fixture cut to its first four trunk
layers (smaller files; the vision tower is dropped, kiln ignores it), plus one MTP layer made from a trunk layer
of the wanted kind: its tensors renamed to the MTP index and perturbed with seeded noise, the hyper-connection
maps dropped for a plain layer, the indexer dropped for a dense DSA layer; then enorm, hnorm, eh_proj
[hidden, 2·hidden], shared_head.norm and optionally shared_head.head. Names stay in the source's scheme.

    python3 tools/make_mtp_fixtures_glm5_next.py          # (re)write every glm5_next-mtp-* fixture

Deterministic: torch's generator is seeded per fixture, and the output files are written sorted.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

kRoot = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"
kTrunkLayers = 4
# Noise relative to each tensor's spread: the MTP layer must differ from the trunk layer it was made from.
kNoise = 0.5
kBigramGain = 4.0


@dataclass(frozen=True)
class MtpFixture:
    name: str
    source: str
    seed: int
    from_layer: int        # the trunk layer (of the wanted kind) the MTP layer is made from
    hyper_connections: bool
    indexer: bool = True   # DSA only: keep its indexer (else it attends densely)
    own_head: bool = True  # shared_head.head (else the trunk's lm_head)
    # Make drafts acceptable often: the trunk's embedding scaled up (so it dominates the residual) and its lm_head
    # a permutation of the embedding (so the target tends to emit perm(current token)); the MTP layer passes the
    # embedding half of eh_proj through scaled likewise and heads with the same lm_head, a bigram of the same map.
    # Random next-n weights are otherwise almost never right, and the accepted path would go untested.
    bigram: bool = False
    # Trunk layers to make further next-n layers from (indices 1, 2, …): plain (no hc), the trunk's lm_head.
    # The drafter runs only layer 0; these are for the loader and the services' state handling.
    extra_plain_from: tuple = ()


kFixtures = [
    # DSA with its pooled indexer and hc streams, MoE (per-expert names), its own head; transformers' save_pretrained names.
    MtpFixture("glm5_next-mtp-dsa", "glm5_next-tiny", 4401, from_layer=3, hyper_connections=True, bigram=True),
    # KDA with hc streams (hc_attn_*, split q/k/v_conv1d), dense MLP, the trunk's lm_head; the original flat names.
    MtpFixture("glm5_next-mtp-kda", "glm5_next-flat", 4402, from_layer=0, hyper_connections=True, own_head=False,
               bigram=True),
    # A plain residual layer (no hc) with a DSA attention without indexer, dense MLP; transformers' state_dict names.
    # Its second next-n layer is a plain KDA one with a MoE (stacked experts).
    MtpFixture("glm5_next-mtp-plain", "glm5_next-shared", 4403, from_layer=1, hyper_connections=False, indexer=False,
               extra_plain_from=(0,)),
]


def text_config(config: dict) -> dict:
    return config["text_config"] if "text_config" in config else config


def cut_config(config: dict, extra: tuple) -> dict:
    config = json.loads(json.dumps(config))
    text = text_config(config)
    text["num_hidden_layers"] = kTrunkLayers
    for key in ("layer_types", "mlp_layer_types", "indexer_types"):
        if key in text:
            text[key] = text[key][:kTrunkLayers]
    text["num_nextn_predict_layers"] = 1 + len(extra)
    config.pop("vision_config", None)
    return config


def perturbed(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    spread = t.float().std().item() if t.numel() > 1 else abs(t.item())
    return (t + kNoise * (spread or 0.1) * torch.randn(t.shape, generator=gen)).to(t.dtype).contiguous()


def build(f: MtpFixture) -> None:
    src = kRoot / f.source
    out = kRoot / f.name
    config = json.loads((src / "config.json").read_text())
    text = text_config(config)
    hidden = text["hidden_size"]
    state = load_file(src / "model.safetensors")
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in state else "model."
    layer_re = re.compile(re.escape(prefix) + r"layers\.(\d+)\.(.*)")
    gen = torch.Generator().manual_seed(f.seed)

    kept: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        if name.startswith("model.visual."):
            continue
        m = layer_re.fullmatch(name)
        if not m or int(m.group(1)) < kTrunkLayers:
            kept[name] = state[name]

    def copy_layer(index: int, from_layer: int, hyper_connections: bool, indexer: bool) -> str:
        """Trunk layer `from_layer` as next-n layer `index`, perturbed; returns its prefix."""
        mtp_prefix = f"{prefix}layers.{kTrunkLayers + index}."
        for name in sorted(state):
            m = layer_re.fullmatch(name)
            if not m or int(m.group(1)) != from_layer:
                continue
            leaf = m.group(2)
            if not hyper_connections and re.match(r"(hc_attn_|hc_ffn_|attn_hc\.|ffn_hc\.)", leaf):
                continue
            if not indexer and leaf.startswith("self_attn.indexer."):
                continue
            kept[mtp_prefix + leaf] = perturbed(state[name], gen)
        return mtp_prefix

    mtp_prefix = copy_layer(0, f.from_layer, f.hyper_connections, f.indexer)
    norm = state[prefix + "norm.weight"]
    eh_proj = torch.randn(hidden, 2 * hidden, generator=gen) * 0.1
    if f.bigram:
        embed = state[prefix + "embed_tokens.weight"]
        perm = torch.randperm(embed.shape[0], generator=gen)
        kept["lm_head.weight"] = (embed[perm] * kBigramGain).contiguous()
        kept[prefix + "embed_tokens.weight"] = (embed * kBigramGain).contiguous()
        eh_proj[:, :hidden] = torch.eye(hidden) * kBigramGain
        kept[mtp_prefix + "enorm.weight"] = torch.ones(hidden)
        kept[mtp_prefix + "shared_head.norm.weight"] = torch.ones(hidden)
        if f.own_head:
            kept[mtp_prefix + "shared_head.head.weight"] = kept["lm_head.weight"].clone()
    else:
        kept[mtp_prefix + "enorm.weight"] = perturbed(torch.ones(hidden), gen)
        kept[mtp_prefix + "shared_head.norm.weight"] = perturbed(norm, gen)
        if f.own_head:
            kept[mtp_prefix + "shared_head.head.weight"] = perturbed(state["lm_head.weight"], gen)
    kept[mtp_prefix + "hnorm.weight"] = perturbed(torch.ones(hidden), gen)
    kept[mtp_prefix + "eh_proj.weight"] = eh_proj.contiguous()
    for i, from_layer in enumerate(f.extra_plain_from, start=1):
        p = copy_layer(i, from_layer, hyper_connections=False, indexer=True)
        kept[p + "enorm.weight"] = perturbed(torch.ones(hidden), gen)
        kept[p + "hnorm.weight"] = perturbed(torch.ones(hidden), gen)
        kept[p + "eh_proj.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.1).contiguous()
        kept[p + "shared_head.norm.weight"] = perturbed(norm, gen)

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cut_config(config, f.extra_plain_from), indent=2, sort_keys=True) + "\n")
    save_file(dict(sorted(kept.items())), out / "model.safetensors", metadata={"format": "pt"})
    print(f"{f.name}: {len(kept)} tensors, {(out / 'model.safetensors').stat().st_size} bytes")


def main() -> None:
    for f in kFixtures:
        build(f)


if __name__ == "__main__":
    main()
