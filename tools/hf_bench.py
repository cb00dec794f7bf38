#!/usr/bin/env python3
"""GLM-4.7-Flash shapes through Hugging Face transformers, for side-by-side figures with `kiln bench decode|prefill`.

Builds Glm4MoeLiteForCausalLM from a config.json (default configs/models/glm-4.7-flash/config.json) with random
bf16 weights made directly on the device (no CPU copy of 30 B parameters), then measures with a plain forward
loop — no generate():

  decode  c1 tok/s at each context: the context is written straight into a DynamicCache as random latents (the
          values do not change the work, as in kiln's bench, and it saves prefilling 128K tokens), then
          --warmup untimed and --steps timed single-token forwards, each feeding the previous step's argmax.
  prefill tok/s at each length: a fresh DynamicCache, the prompt in --chunk-token forwards (logits of the last
          token only), as kiln's scheduler and `kiln bench prefill` chunk it; after one untimed chunk.
          --one-shot: the whole prompt in one forward, as transformers' users run it (generate()'s prefill:
          one forward filling an empty cache, logits of the last token only) -- the peer figure for RESULTS.md.
          Over an empty cache sdpa runs with is_causal and no mask; a later chunk needs a [chunk, keys] mask.

transformers 5.x caches MLA's compressed latents (kv_lora_rank + rope per token and layer) and expands the
whole cache through kv_b_proj on every forward, so a step's time grows with the context. Points whose
estimated memory (weights + latent cache + the per-layer expansion + the chunk's activations) exceeds the free
device memory are skipped with the estimate; an out-of-memory error also skips the point.

  python3 tools/hf_bench.py --compile --one-shot --json hf.json   # the peer table on a GPU
  python3 tools/hf_bench.py --json hf.json                   # prefill chunked at 8K instead
  python3 tools/hf_bench.py --tiny                           # the tiny model on the CPU (a smoke test)

Prints markdown tables; --json writes them with date, device, versions and the implementations used.
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
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLM47_FLASH = os.path.join(REPO, "configs", "models", "glm-4.7-flash", "config.json")
TINY = os.path.join(REPO, "models", "tiny-glm", "config.json")
BF16 = 2


def int_list(text: str) -> list[int]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        mult = 1024 if item[-1] in "kK" else 1
        out.append(int(item[:-1] if mult > 1 else item) * mult)
    if not out or any(v <= 0 for v in out):
        raise argparse.ArgumentTypeError(f"`{text}` is not a list of positive integers (K = 1024)")
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="config.json of a glm4_moe_lite model (default: GLM-4.7-Flash; --tiny: the tiny model)")
    p.add_argument("--tiny", action="store_true", help="the repository's tiny model at tiny sizes (runs on the CPU)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--contexts", type=int_list, help="decode contexts (default 4096,32768,131072; --tiny: 64,300)")
    p.add_argument("--lengths", type=int_list, help="prefill lengths (default 4096,32768,131072; --tiny: 100,333)")
    p.add_argument("--chunk", type=int, help="prefill tokens per forward (default 8192; --tiny: 64)")
    p.add_argument("--one-shot", action="store_true",
                   help="prefill each prompt in one forward over the whole prompt, as transformers' users run it "
                        "(generate()'s prefill); the peer figure. Not with --chunk")
    p.add_argument("--steps", type=int, help="timed decode steps per context (default 32; --tiny: 4)")
    p.add_argument("--warmup", type=int, help="untimed decode steps before them (default 3; --tiny: 1)")
    p.add_argument("--attn", default=None, help="attn_implementation (default: what transformers picks, sdpa here)")
    p.add_argument("--experts", default=None, help="experts_implementation (default: what transformers picks)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode step (dynamic shapes; compiled in the warm-up steps). Prefill stays "
                        "eager: its shapes change from chunk to chunk and recompiling would be timed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the results as JSON to this file")
    a = p.parse_args(argv)
    if a.one_shot and a.chunk is not None:
        p.error("--one-shot runs each prompt in one forward: drop --chunk")
    a.config = a.config or (TINY if a.tiny else GLM47_FLASH)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.contexts = a.contexts or ([64, 300] if a.tiny else [4096, 32768, 131072])
    a.lengths = a.lengths or ([100, 333] if a.tiny else [4096, 32768, 131072])
    a.chunk = a.chunk or (64 if a.tiny else 8192)
    a.steps = a.steps if a.steps is not None else (4 if a.tiny else 32)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    if a.steps < 1 or a.warmup < 0 or a.chunk < 1:
        p.error("--steps and --chunk must be at least 1, --warmup at least 0")
    return a


def build_model(args: argparse.Namespace):
    """The model with random bf16 weights, created on the device: parameters are allocated there by the default
    device context and filled there by transformers' initializer."""
    config = AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(args.config)))
    kwargs = {"dtype": torch.bfloat16}
    if args.attn:
        kwargs["attn_implementation"] = args.attn
    if args.experts:
        kwargs["experts_implementation"] = args.experts
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    model.eval()
    sync(args.device)
    placed = {p.device.type for p in model.parameters()}
    if placed != {torch.device(args.device).type}:
        raise SystemExit(f"parameters landed on {sorted(placed)}, not {args.device}")
    return model, time.perf_counter() - t0


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def free_bytes(device: str) -> int | None:
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info()[0]
    return None


def latent_bytes_per_token(c) -> int:
    return c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * BF16


def expansion_bytes(c, keys: int) -> int:
    """Transient memory of one layer's attention over `keys` cached tokens: kv_b_proj's output
    (heads × (nope + v)), the concatenated keys (heads × qk) and a contiguous copy of keys and values for the
    attention kernel."""
    h = c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    return keys * h * ((c.qk_nope_head_dim + c.v_head_dim) + qk + (qk + c.v_head_dim)) * BF16


def chunk_bytes(c, tokens: int, keys: int) -> int:
    """Activations of one forward of `tokens` new tokens over `keys` keys: a bf16 mask [tokens, keys] when some keys
    are cached (over an empty cache sdpa runs with is_causal and no mask) plus a generous 64 hidden widths per token
    and the widest MLP intermediates."""
    per_token = 64 * c.hidden_size + 4 * max(c.intermediate_size, c.num_experts_per_tok * c.moe_intermediate_size)
    mask = tokens * keys * BF16 if keys > tokens else 0
    return mask + tokens * per_token * BF16


def too_big(need: int, free: int | None) -> str | None:
    if free is None or need <= 0.9 * free:
        return None
    return f"needs ~{need / 2**30:.1f} GiB beyond the weights, {free / 2**30:.1f} GiB free"


def fill_cache(model, context: int, device: str) -> DynamicCache:
    """A DynamicCache holding `context` random latent tokens in every layer (what the model's attention writes:
    kv_a_layernorm'd latents [1, 1, seq, kv_lora_rank] and roped keys [1, 1, seq, rope])."""
    c = model.config
    cache = DynamicCache(config=c)
    for layer in range(c.num_hidden_layers):
        kv = torch.randn(1, 1, context, c.kv_lora_rank, dtype=torch.bfloat16, device=device)
        rope = torch.randn(1, 1, context, c.qk_rope_head_dim, dtype=torch.bfloat16, device=device)
        cache.update(kv, rope, layer)
    return cache


@torch.inference_mode()
def bench_decode(model, forward, args, context: int) -> dict:
    c = model.config
    need = context * latent_bytes_per_token(c) + expansion_bytes(c, context + args.warmup + args.steps) + chunk_bytes(
        c, 1, context + args.warmup + args.steps)
    if reason := too_big(need, free_bytes(args.device)):
        return {"context": context, "skipped": reason}
    cache = fill_cache(model, context, args.device)
    token = torch.tensor([[11]], device=args.device)

    def step():
        nonlocal token
        logits = forward(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1, keepdim=True)

    for _ in range(args.warmup):
        step()
    sync(args.device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(args.device)
    seconds = time.perf_counter() - t0
    del cache
    return {"context": context, "steps": args.steps, "seconds": seconds, "tok_s": args.steps / seconds,
            "ms_per_step": 1e3 * seconds / args.steps}


@torch.inference_mode()
def prefill(forward, ids: torch.Tensor, chunk: int) -> DynamicCache:
    cache = DynamicCache(config=forward.config)
    for start in range(0, ids.shape[1], chunk):
        forward(input_ids=ids[:, start:start + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


@torch.inference_mode()
def bench_prefill(model, forward, args, length: int) -> dict:
    c = model.config
    chunk = length if args.one_shot else args.chunk
    chunks = -(-length // chunk)
    need = length * latent_bytes_per_token(c) + expansion_bytes(c, length) + chunk_bytes(c, min(chunk, length), length)
    if reason := too_big(need, free_bytes(args.device)):
        return {"length": length, "chunks": chunks, "skipped": reason}
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    ids = torch.randint(0, c.vocab_size, (1, length), device=args.device, generator=gen)
    sync(args.device)
    t0 = time.perf_counter()
    cache = prefill(forward, ids, chunk)
    sync(args.device)
    seconds = time.perf_counter() - t0
    del cache
    return {"length": length, "chunks": chunks, "seconds": seconds, "tok_s": length / seconds}


def guarded(fn, key: str, value: int, device: str) -> dict:
    """Runs one point; an out-of-memory error skips it rather than ending the run."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError as e:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return {key: value, "skipped": f"out of memory: {str(e).splitlines()[0]}"}


class Forward:
    """The model's forward, optionally compiled; keeps the config at hand for DynamicCache."""

    def __init__(self, model, compile_it: bool):
        self.config = model.config
        self.fn = torch.compile(model.forward, dynamic=True) if compile_it else model.forward

    def __call__(self, **kwargs):
        return self.fn(**kwargs)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return f"{props.name} ({props.total_memory / 2**30:.1f} GiB)"
    return f"CPU ({torch.get_num_threads()} threads)"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    model, build_s = build_model(args)
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    decode_forward, prefill_forward = Forward(model, args.compile), Forward(model, False)
    impl = {"attn_implementation": c._attn_implementation, "experts_implementation": c._experts_implementation,
            "torch_compile_decode": args.compile, "prefill": "one-shot" if args.one_shot else f"chunks of {args.chunk}"}
    report = {
        "benchmark": "hf_transformers",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name(args.device),
        "command": "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO)] + argv),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__},
        "model": {"config": os.path.relpath(os.path.abspath(args.config), REPO), "model_type": c.model_type,
                  "layers": c.num_hidden_layers, "params": params, "weight_gib": params * BF16 / 2**30},
        "implementation": impl,
        "decode": [], "prefill": [],
    }
    print(f"transformers {transformers.__version__} + torch {torch.__version__}, {report['date']}, {report['device']}: "
          f"{report['model']['config']} ({c.num_hidden_layers} layers, {params / 1e9:.2f} B params, "
          f"{report['model']['weight_gib']:.2f} GiB bf16, random, built on {args.device} in {build_s:.1f} s)")
    print(f"attn_implementation = {impl['attn_implementation']}, experts_implementation = "
          f"{impl['experts_implementation']}, torch.compile of the decode step: {'on' if args.compile else 'off'}, "
          f"prefill: {impl['prefill']}")
    print(f"command: {report['command']}\n", flush=True)

    with torch.inference_mode():  # one untimed chunk (one-shot: the shortest prompt): kernels and cuBLAS handles
        warm_len = min(args.lengths) if args.one_shot else min(args.chunk, max(args.lengths))
        warm = torch.randint(0, c.vocab_size, (1, warm_len), device=args.device)
        prefill(prefill_forward, warm, warm_len if args.one_shot else args.chunk)
        sync(args.device)

    for ctx in args.contexts:
        r = guarded(lambda: bench_decode(model, decode_forward, args, ctx), "context", ctx, args.device)
        report["decode"].append(r)
        print(f"decode context {ctx}: " + (r.get("skipped") or f"{r['tok_s']:.2f} tok/s"), file=sys.stderr, flush=True)
    for n in args.lengths:
        r = guarded(lambda: bench_prefill(model, prefill_forward, args, n), "length", n, args.device)
        report["prefill"].append(r)
        print(f"prefill {n}: " + (r.get("skipped") or f"{r['tok_s']:.1f} tok/s"), file=sys.stderr, flush=True)

    print(f"| context | c1 decode tok/s | ms/step |\n|---|---|---|")
    for r in report["decode"]:
        cells = f"skipped: {r['skipped']} | |" if "skipped" in r else f"{r['tok_s']:.2f} | {r['ms_per_step']:.2f} |"
        print(f"| {r['context']} | {cells}")
    forwards = "forwards (one-shot)" if args.one_shot else f"chunks of {args.chunk}"
    print(f"\n| prompt tokens | {forwards} | seconds | prefill tok/s |\n|---|---|---|---|")
    for r in report["prefill"]:
        cells = f"skipped: {r['skipped']} | |" if "skipped" in r else f"{r['seconds']:.3f} | {r['tok_s']:.1f} |"
        print(f"| {r['length']} | {r['chunks']} | {cells}")
    report["steps"], report["warmup"] = args.steps, args.warmup
    report["chunk"] = None if args.one_shot else args.chunk
    report["one_shot"] = args.one_shot
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
