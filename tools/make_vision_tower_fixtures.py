#!/usr/bin/env python3
"""Fixtures for plugins/vision's tower and image modality: tiny random glm5_next checkpoints with a vision tower, and
transformers 5.17's outputs for them.

    python3 tools/make_vision_tower_fixtures.py            # (re)generate plugins/vision/tests/data/tower-*
    python3 tools/make_vision_tower_fixtures.py --check    # recompute, require the committed references unchanged

Each fixture folder holds config.json, model.safetensors and reference.safetensors:
  - `tower_<i>_grid` [images, 3] and `tower_<i>_embeddings` [Σ tokens, out_hidden]: the vision model
    (Glm5NextModel.get_image_features) on synthetic pixel_values the C++ test computes from the same integer formula
    (pixel_values() below), several images of different grids in one call;
  - in `tower-e2e` also the whole model: `prompt_ids` holding two images (begin marker, one `<|image|>` per merged
    embedding, end marker) and `prompt_logits` of Glm5NextForConditionalGeneration on it with the images' synthetic
    pixel_values (grids `image_<k>_grid`, the shapes the processor makes: multiples of 2 patches). Real images reach
    the tower through the C++ processor, which tools/make_vision_fixtures.py pins bit for bit to transformers'.

Everything runs on the CPU in float32 with eager attention, single-threaded. Weights are rounded to bfloat16 and
stored as BF16 (the real checkpoint's dtype, and half the bytes); the reference computes in float32 on those values.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.glm5_next import Glm5NextConfig, Glm5NextForConditionalGeneration

kExpectedTransformers = "5.17.0"
kRepoRoot = Path(__file__).resolve().parent.parent
kData = kRepoRoot / "plugins" / "vision" / "tests" / "data"
kTextTokenizer = kRepoRoot / "tests" / "data" / "models" / "glm5_next-tiny" / "tokenizer.json"

# glm5_next-tiny's tokenizer (tests/data/models) has the markers at these ids.
kTokens = dict(image_start_token_id=486, image_end_token_id=487, video_start_token_id=488, video_end_token_id=489,
               image_token_id=510, video_token_id=511)

kText = dict(vocab_size=512, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_attention_heads=2,
             num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16,
             n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, initializer_range=0.1,
             max_position_embeddings=4096, pad_token_id=0, tie_word_embeddings=False, num_hidden_layers=4,
             linear_num_heads=2, linear_head_dim=16, linear_conv_kernel_dim=4, linear_lower_bound=-5.0, hc_mult=4,
             index_n_heads=4, index_head_dim=16, index_kpool=4, index_topk=8)


@dataclass(frozen=True)
class Fixture:
    name: str
    seed: int
    vision: dict
    grids: list[list[list[int]]]   # tower calls, each a list of (t, h, w) patch grids
    images: tuple[tuple[int, int, int], ...] = ()  # image grids of the whole-model prompt


kFixtures = [
    # Patch 14 as the real model (the processor's canvas needs it): the whole-model fixture.
    Fixture("tower-e2e", 5101, dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=32,
                                    projection_intermediate_size=40, patch_size=14),
            grids=[[[1, 4, 6]], [[1, 2, 2], [1, 6, 4], [1, 2, 8]]], images=((1, 4, 4), (1, 6, 8))),
    # Four heads of 8 (2 RoPE frequencies per axis), patch 4, out_hidden ≠ hidden, one block.
    Fixture("tower-heads4", 5202, dict(depth=1, hidden_size=32, num_heads=4, intermediate_size=40, out_hidden_size=24,
                                       projection_intermediate_size=20, patch_size=4),
            grids=[[[1, 2, 12]], [[1, 10, 2], [1, 4, 4]]]),
    # Three heads of 16, patch 2, three blocks, wide and tall grids, and a video-style t = 2 entry (two frames, each
    # its own attention segment).
    Fixture("tower-heads3", 5303, dict(depth=3, hidden_size=48, num_heads=3, intermediate_size=64, out_hidden_size=40,
                                       projection_intermediate_size=56, patch_size=2),
            grids=[[[1, 8, 8], [1, 2, 14]], [[2, 4, 6]], [[1, 12, 2]]]),
]


def pixel_values(num_patches: int, patch_dim: int, seed: int) -> torch.Tensor:
    """Values in [-1, 1] from an integer formula the C++ test evaluates identically (double, then float)."""
    p = torch.arange(num_patches, dtype=torch.int64)[:, None]
    j = torch.arange(patch_dim, dtype=torch.int64)[None, :]
    v = (p * 7919 + j * 104729 + seed * 31) % 2001
    return (v.double() / 1000.0 - 1.0).float()


def config_json(fixture: Fixture) -> dict:
    vision = dict(fixture.vision, model_type="glm5_next_vision")
    return dict(model_type="glm5_next", architectures=["Glm5NextForConditionalGeneration"],
                text_config=dict(kText, model_type="glm5_next_text"), vision_config=vision,
                tie_word_embeddings=False, **kTokens)


def build_model(fixture: Fixture) -> torch.nn.Module:
    cfg = config_json(fixture)
    cfg.pop("model_type"), cfg.pop("architectures")
    cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "model_type"}
    cfg["vision_config"] = {k: v for k, v in cfg["vision_config"].items() if k != "model_type"}
    torch.manual_seed(fixture.seed)
    model = Glm5NextForConditionalGeneration._from_config(Glm5NextConfig(**cfg), attn_implementation="eager",
                                                         dtype=torch.float32)
    gen = torch.Generator().manual_seed(fixture.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norm weights and biases start constant: random ones catch a C++ path that skips or swaps one.
            if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias") or "e_score_correction_bias" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.startswith("model.visual.") and ("gate_proj" in name or "up_proj" in name):
                # Large enough that the SwiGLU clamps (gate ≤ 10, |up| ≤ 10) bite on a share of the values.
                p.copy_(p * 40.0)
            elif name.startswith("model.visual."):
                p.copy_(p * 3.0)
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


def tower_references(fixture: Fixture, model) -> dict[str, torch.Tensor]:
    v = model.config.vision_config
    patch_dim = 3 * v.temporal_patch_size * v.patch_size ** 2
    refs = {}
    for i, grids in enumerate(fixture.grids):
        grid = torch.tensor(grids, dtype=torch.int64)
        pixels = pixel_values(int(grid.prod(-1).sum()), patch_dim, fixture.seed + i)
        with torch.no_grad():
            out = model.model.get_image_features(pixel_values=pixels, image_grid_thw=grid).pooler_output
        refs[f"tower_{i}_grid"] = grid.to(torch.int32)
        refs[f"tower_{i}_embeddings"] = torch.cat(out)
    return refs


def image_references(fixture: Fixture, model) -> dict[str, torch.Tensor]:
    """The whole model on a prompt holding images of the given grids: each image's begin marker, one placeholder per
    merged embedding, end marker, text between. The pixels are the synthetic formula's (seed + 100 + k)."""
    if not fixture.images:
        return {}
    v = model.config.vision_config
    patch_dim = 3 * v.temporal_patch_size * v.patch_size ** 2
    refs, pixels, counts = {}, [], []
    for k, grid in enumerate(fixture.images):
        n = grid[0] * grid[1] * grid[2]
        pixels.append(pixel_values(n, patch_dim, fixture.seed + 100 + k))
        counts.append(n // v.spatial_merge_size ** 2)
        refs[f"image_{k}_grid"] = torch.tensor([grid], dtype=torch.int32)
    gen = torch.Generator().manual_seed(fixture.seed + 7)
    text = lambda n: torch.randint(1, 476, (n,), generator=gen).tolist()  # ordinary tokens, below the specials
    ids = text(9)
    for n in counts:
        ids += [kTokens["image_start_token_id"]] + [kTokens["image_token_id"]] * n + [kTokens["image_end_token_id"]]
        ids += text(5)
    prompt = torch.tensor(ids, dtype=torch.int64)
    grid = torch.tensor(list(fixture.images), dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=prompt[None], pixel_values=torch.cat(pixels), image_grid_thw=grid,
                       use_cache=False).logits[0]
    refs["prompt_ids"] = prompt.to(torch.int32)
    refs["prompt_logits"] = logits
    return refs


def compute_references(fixture: Fixture, model) -> dict[str, torch.Tensor]:
    refs = tower_references(fixture, model)
    refs.update(image_references(fixture, model))
    return {k: v.contiguous().clone() for k, v in refs.items()}


def reload(path: Path) -> torch.nn.Module:
    return Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def write(fixture: Fixture, model, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    if fixture.images:
        # A copy: casting the model itself would round its non-persistent RoPE buffer too.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)
    else:
        # Tower-only fixtures keep just the tower's tensors, under the names save_pretrained gives them (tower-e2e is
        # written by save_pretrained itself and checked to reload).
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                 if k.startswith("model.visual.")}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(config_json(fixture), indent=2, sort_keys=True) + "\n")
    if fixture.images:  # the server test serves this folder
        (out / "tokenizer.json").write_bytes(kTextTokenizer.read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if transformers.__version__ != kExpectedTransformers:
        print(f"need transformers=={kExpectedTransformers}, found {transformers.__version__}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    ok = True
    for fixture in kFixtures:
        out = kData / fixture.name
        built = build_model(fixture)
        if args.check:
            fresh = compute_references(fixture, reload(out) if fixture.images else built)
            saved = load_file(str(out / "reference.safetensors"))
            same = saved.keys() == fresh.keys() and all(torch.equal(saved[k], fresh[k]) for k in saved)
            print(f"{fixture.name}: {'OK' if same else 'MISMATCH'}")
            ok &= same
            continue
        write(fixture, built, out)
        # The references come from the checkpoint as written and loaded back, as transformers' users load it.
        model = reload(out) if fixture.images else built
        refs = compute_references(fixture, model)
        if not torch.equal(refs["tower_0_embeddings"], compute_references(fixture, built)["tower_0_embeddings"]):
            raise AssertionError(f"{fixture.name}: the written checkpoint reloads to different embeddings")
        save_file(refs, str(out / "reference.safetensors"), metadata={"generator": "tools/make_vision_tower_fixtures.py",
                                                                       "transformers": transformers.__version__,
                                                                       "torch": torch.__version__})
        sizes = ", ".join(f"{f.name} {f.stat().st_size / 1e3:.0f} kB" for f in sorted(out.iterdir()))
        print(f"{fixture.name}: {sizes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
