#!/usr/bin/env python3
"""glm5_next's vision tower through Hugging Face transformers, beside `kiln_bench_vision_tower_bench`.

Builds Glm5NextVisionModel at GLM-5.3-Flash's vision shapes (transformers' Glm5NextVisionConfig defaults with
out_hidden_size = 4096, the text model's width) with random weights, on the GPU in bf16 with the default attention
implementation (sdpa) — how its users run it — and times one forward per image (torch.cuda.synchronize around it,
median of several after two warm-ups) for square images of 336, 1024 and 2048 pixels, whose grids are the ones
kiln's processor makes (canvas multiples of 28: 24×24, 74×74 and 148×148 patches).

  python3 tools/hf_vision_bench.py [--dtype bf16|fp32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers
from transformers.models.glm5_next import Glm5NextVisionConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextVisionModel

SIZES = [(336, 24), (1024, 74), (2048, 148)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    config = Glm5NextVisionConfig(out_hidden_size=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Glm5NextVisionModel._from_config(config, dtype=dtype).eval()
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"{args.dtype}, attention {model.config._attn_implementation}")
    print("| image | patches | tokens | ms / image | images / s |")
    print("|---|---|---|---|---|")
    for side, g in SIZES:
        grid = torch.tensor([[1, g, g]], device="cuda")
        pixels = torch.randn(g * g, patch_dim, device="cuda", dtype=dtype)
        times = []
        try:
            with torch.inference_mode():
                for i in range(2 + (7 if side < 2048 else 3)):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    model(pixels, grid_thw=grid)
                    torch.cuda.synchronize()
                    if i >= 2:
                        times.append((time.perf_counter() - t0) * 1e3)
        except torch.OutOfMemoryError as e:
            print(f"| {side}² | {g * g} | {g * g // 4} | out of memory ({str(e).splitlines()[0][:80]}) | — |")
            torch.cuda.empty_cache()
            continue
        ms = statistics.median(times)
        print(f"| {side}² | {g * g} | {g * g // 4} | {ms:.1f} | {1000 / ms:.2f} |")


if __name__ == "__main__":
    main()
