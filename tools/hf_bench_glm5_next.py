#!/usr/bin/env python3
"""GLM-5.3-Flash shapes (glm5_next) through Hugging Face transformers, the peer beside bench/glm5_next_bench.cpp.

Builds Glm5NextForConditionalGeneration from a config.json (default configs/models/glm-5.3-flash-8layer: the
published shapes cut to 8 layers, 3:1 KDA:DSA) with random bf16 weights made on the device and a one-block vision
tower (text prompts never run it), then, the way its users run it:

  prefill  one forward over the whole prompt (one-shot), timed after an untimed one of the same length;
  decode   single-token forwards after that prompt (the cache holds its KDA states and DSA keys), --warmup untimed
           and --steps timed, each feeding the previous argmax; with --compile the decode forward is torch.compile'd
           (a failure to compile is reported and the eager figure kept).

  python3 tools/hf_bench_glm5_next.py --lengths 4096 --json hf_glm5.json      # on the GPU
  python3 tools/hf_bench_glm5_next.py --tiny                                   # the tiny fixture on the CPU
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

import torch
import transformers
from transformers import AutoConfig
from transformers.models.glm5_next import Glm5NextForConditionalGeneration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(REPO, "configs", "models", "glm-5.3-flash-8layer", "config.json")
TINY = os.path.join(REPO, "tests", "data", "models", "glm5_next-tiny", "config.json")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device")
    p.add_argument("--lengths", default=None, help="prompt lengths (default 4096; --tiny 100)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--json")
    a = p.parse_args(argv)
    config_path = a.config or (TINY if a.tiny else DEFAULT)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lengths = [int(x) for x in (a.lengths or ("100" if a.tiny else "4096")).split(",")]
    steps = a.steps or (4 if a.tiny else 32)

    config = AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(config_path)))
    v = config.vision_config
    v.depth, v.hidden_size, v.num_heads, v.intermediate_size = 1, 64, 2, 64
    v.out_hidden_size = config.text_config.hidden_size
    torch.manual_seed(1)
    t0 = time.perf_counter()
    with torch.device(device):
        model = Glm5NextForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.eval()
    sync(device)
    build_s = time.perf_counter() - t0
    params = sum(x.numel() for x in model.parameters())
    c = config.text_config
    report = {"benchmark": "hf_transformers_glm5_next",
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "device": torch.cuda.get_device_name() if device.startswith("cuda") else "CPU",
              "command": "python3 " + " ".join(shlex.quote(x) for x in [os.path.relpath(__file__, REPO)] + argv),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "model": {"config": os.path.relpath(os.path.abspath(config_path), REPO), "layers": c.num_hidden_layers,
                        "params": params},
              "attn_implementation": model.config._attn_implementation, "prefill": [], "decode": []}
    print(f"transformers {transformers.__version__} + torch {torch.__version__}, {report['date']}, {report['device']}: "
          f"{report['model']['config']} ({c.num_hidden_layers} layers, {params / 1e9:.2f} B params, random bf16, "
          f"built in {build_s:.1f} s), attn {report['attn_implementation']}", flush=True)
    decode_fn = model.forward
    compiled = False
    if a.compile:
        try:
            decode_fn = torch.compile(model.forward, dynamic=True)
            compiled = True
        except Exception as e:  # noqa: BLE001
            report["compile_error"] = str(e).splitlines()[0]
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(0, c.vocab_size, (1, n), device=device)
            model(input_ids=ids, use_cache=True, logits_to_keep=1)  # untimed: kernels, allocator
            sync(device)
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            sync(device)
            sec = time.perf_counter() - t0
            report["prefill"].append({"length": n, "seconds": sec, "tok_s": n / sec})
            print(f"prefill {n}: {n / sec:.1f} tok/s ({sec:.3f} s)", flush=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

            def step(fn):
                nonlocal token
                logits = fn(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                token = logits[:, -1].argmax(-1, keepdim=True)

            fn = decode_fn
            try:
                for _ in range(a.warmup):
                    step(fn)
            except Exception as e:  # noqa: BLE001  a compile failure surfaces on the first call
                if not compiled:
                    raise
                report["compile_error"] = str(e).splitlines()[0][:300]
                compiled, fn = False, model.forward
                for _ in range(a.warmup):
                    step(fn)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                step(fn)
            sync(device)
            sec = time.perf_counter() - t0
            report["decode"].append({"context": n, "steps": steps, "tok_s": steps / sec, "ms_per_step": 1e3 * sec / steps,
                                     "compiled": compiled})
            print(f"decode after {n}: {steps / sec:.2f} tok/s ({'compiled' if compiled else 'eager'})"
                  + (f"; compile failed: {report['compile_error']}" if "compile_error" in report else ""), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
