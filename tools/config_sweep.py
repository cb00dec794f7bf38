#!/usr/bin/env python3
"""Differential sweep: random transformers checkpoints against `kiln generate` on the CPU.

Each seed draws an architecture (deepseek_v3, glm4_moe_lite, glm_moe_dsa; glm5_next with --glm5-next) and a config
from the options those classes take (heads, LoRA ranks, nope / rope / v head dims, experts, groups, top-k,
norm_topk_prob, shared experts, dense / sparse layer patterns, tied heads, rope type default / yarn / linear / llama3 /
dynamic, interleaved or rotate-half rope, DSA indexer heads / dims / top-k / shared layers; for glm5_next the KDA /
DSA layer schedule, KDA heads / head dim / conv kernel / gate lower bound, hyper-connection width and Sinkhorn
iterations, the k-pool indexer's pool size, top-k and tail rule, swiglu_limit), fp32 or bf16 weights, vocabularies
that are not powers of two, prompts of 9 to 80 tokens (glm5_next: past one 64-token KDA chunk). It builds the model
with random weights (every parameter transformers initialises to a constant made random, as the fixture generators
do), and compares 8 greedy tokens from transformers (fp32, eager) with kiln's (fp32 compute, fp32 KV: a bf16
checkpoint's default KV layout is bf16, which rounds what transformers keeps in fp32). With --chunked, a seed that
matches runs again with its prompt 7 tokens a step over 16-token KV blocks and must give the same tokens.

glm5_next with `index_kpool_always_select_tail: false` and pools of 2 or more: a sequence's first index_kpool − 1
tokens complete no pool, so a DSA layer selects no key for them. transformers' eager path then masks every key with
the same finite minimum and averages all of the step's keys, later tokens included (its SDPA path gives NaN); kiln
gives such a query a zero attention output. Divergences of those configs are reported as `empty-selection`.

A divergence is reported as MISMATCH unless transformers' own top-two logits at that step lie within 2e-3 (near-tie:
both answers are correct fp32 implementations) or transformers run in fp64 gives kiln's tokens (fp64-agrees: an
expert or indexer choice inside fp32 rounding of a tie upstream). Configs transformers cannot build or run are
skipped (hf-refuses); configs kiln refuses print kiln's message (kiln-error), which should name config.json's field.

    python3 tools/config_sweep.py --kiln build/bin/kiln --seeds 0:100
    python3 tools/config_sweep.py --kiln build/bin/kiln --seeds 7 --keep   # keep the checkpoint to debug

    python3 tools/config_sweep.py --kiln build/bin/kiln --seeds 0:100 --glm5-next

Needs torch and transformers 5.17 (tools/requirements.txt); single-threaded, about 2 s per seed (glm5_next 4 s).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v3 import DeepseekV3Config
from transformers.models.glm4_moe_lite import Glm4MoeLiteConfig
from transformers.models.glm5_next import Glm5NextConfig, Glm5NextForConditionalGeneration
from transformers.models.glm_moe_dsa import GlmMoeDsaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_reference_glm5_next as glm5_next_fixtures  # noqa: E402
from make_reference import randomize_beyond_init  # noqa: E402

kNewTokens = 8
kNearTie = 2e-3


def draw_rope(r: random.Random) -> dict:
    kind = r.choice(["default", "default", "yarn", "linear", "dynamic", "llama3"])
    theta = r.choice([100.0, 1e4, 5e5])
    if kind == "default":
        return {"rope_type": "default", "rope_theta": theta}
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": r.choice([2.0, 4.0])}
    if kind == "dynamic":
        return {"rope_type": "dynamic", "rope_theta": theta, "factor": 2.0}
    if kind == "llama3":
        return {"rope_type": "llama3", "rope_theta": theta, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    rope = {"rope_type": "yarn", "rope_theta": theta, "factor": r.choice([2.0, 4.0, 40.0]),
            "original_max_position_embeddings": r.choice([8, 16, 64])}
    if r.random() < 0.7:
        rope.update(beta_fast=r.choice([8, 32]), beta_slow=1)
    if r.random() < 0.6:
        rope["mscale"] = r.choice([0.707, 1.0])
    if r.random() < 0.5:
        rope["mscale_all_dim"] = r.choice([0.5, 0.707, 1.0])
    return rope


def draw_config(arch: str, r: random.Random):
    heads = r.choice([1, 2, 3, 4, 6])
    layers = r.choice([1, 2, 3, 4])
    experts = r.choice([4, 8, 16])
    groups = r.choice([g for g in (1, 2, 4) if experts % g == 0])
    args = dict(
        vocab_size=r.choice([200, 256, 333]), hidden_size=r.choice([32, 48, 64, 80]),
        intermediate_size=r.choice([24, 48, 72]), moe_intermediate_size=r.choice([8, 16, 24]),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=r.choice([None, 16, 32]), kv_lora_rank=r.choice([16, 24, 32, 48]),
        qk_nope_head_dim=r.choice([8, 12, 16, 32]), qk_rope_head_dim=r.choice([2, 4, 8, 16]),
        v_head_dim=r.choice([8, 16, 20]), n_routed_experts=experts, n_shared_experts=r.choice([0, 1, 2]),
        num_experts_per_tok=r.choice([1, 2, 3]), norm_topk_prob=r.random() < 0.6, n_group=groups,
        topk_group=r.randint(1, groups), routed_scaling_factor=r.choice([1.0, 1.8, 2.5]),
        rms_norm_eps=r.choice([1e-5, 1e-6]), initializer_range=0.1, tie_word_embeddings=r.random() < 0.2,
        max_position_embeddings=r.choice([64, 2048]), rope_parameters=draw_rope(r))
    if args["num_experts_per_tok"] > args["topk_group"] * experts // groups:
        args["num_experts_per_tok"] = 1
    if arch == "deepseek_v3":
        return DeepseekV3Config(**args, first_k_dense_replace=r.choice([0, 1, 2]), rope_interleave=r.random() < 0.7)
    mlp = [r.choice(["dense", "sparse"]) for _ in range(layers)]
    if arch == "glm4_moe_lite":
        return Glm4MoeLiteConfig(**args, mlp_layer_types=mlp, rope_interleave=r.random() < 0.7)
    # glm_moe_dsa: the indexer needs the compressed query; transformers' top-k fails above the prompt length.
    args["q_lora_rank"] = args["q_lora_rank"] or 16
    indexers = ["full"] + [r.choice(["full", "shared"]) for _ in range(layers - 1)]
    return GlmMoeDsaConfig(**args, mlp_layer_types=mlp, index_topk=r.choice([2, 4, 8]),
                           index_head_dim=r.choice([8, 16, 32]), index_n_heads=r.choice([1, 2, 3, 4, 8]),
                           indexer_types=indexers)


K, D = "linear_attention", "deepseek_sparse_attention"


def draw_glm5_next_text(r: random.Random) -> dict:
    layers = r.randint(1, 6)
    types = [r.choice([K, K, D]) for _ in range(layers)]
    if D not in types:  # transformers' cache needs one attention layer to report a length
        types[r.randrange(layers)] = D
    heads = r.choice([1, 2, 3, 4])
    kpool = r.choice([1, 2, 4, 16])
    text = dict(
        vocab_size=r.choice([200, 256, 512]), hidden_size=r.choice([32, 48, 64]), intermediate_size=r.choice([24, 48]),
        moe_intermediate_size=r.choice([8, 16]), num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, q_lora_rank=r.choice([16, 32]), kv_lora_rank=r.choice([16, 32]),
        qk_nope_head_dim=r.choice([8, 16, 32]), v_head_dim=r.choice([8, 16]), n_routed_experts=r.choice([4, 8, 16]),
        n_shared_experts=r.choice([0, 1, 2]), num_experts_per_tok=r.choice([1, 2, 3]),
        norm_topk_prob=r.random() < 0.7, routed_scaling_factor=r.choice([1.0, 2.5]), initializer_range=0.1,
        max_position_embeddings=4096, pad_token_id=0, tie_word_embeddings=False, rms_norm_eps=r.choice([1e-5, 1e-6]),
        layer_types=types, mlp_layer_types=[r.choice(["dense", "sparse"]) for _ in range(layers)],
        linear_num_heads=r.choice([1, 2, 3, 4]), linear_head_dim=r.choice([8, 16]),
        linear_conv_kernel_dim=r.choice([2, 3, 4]), linear_lower_bound=r.choice([-5.0, None]),
        hc_mult=r.choice([1, 2, 3, 4]), hc_sinkhorn_iters=r.choice([20, 3]), index_n_heads=r.choice([1, 2, 4, 8]),
        index_head_dim=r.choice([8, 16, 32]), index_kpool=kpool,
        index_topk=kpool * r.choice([1, 2, 4, 8]),  # transformers requires a multiple of the pool
        index_kpool_always_select_tail=r.random() < 0.7, swiglu_limit=r.choice([10.0, 0.5, 100.0]))
    indexers, full_seen = [], False
    for t in types:  # a shared indexer reuses the last full DSA layer's selection
        shared = t == D and full_seen and r.random() < 0.4
        indexers.append("shared" if shared else "full")
        full_seen = full_seen or t == D
    text["indexer_types"] = indexers
    return text


def build(arch: str, r: random.Random, seed: int):
    """The config's model with random weights (or the error transformers raises for the config)."""
    if arch == "glm5_next":
        text = draw_glm5_next_text(r)
        config = Glm5NextConfig(text_config=text, vision_config=dict(glm5_next_fixtures.kTinyVision),
                                tie_word_embeddings=False)
        model = Glm5NextForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
        glm5_next_fixtures.randomize_beyond_init(model, torch.Generator().manual_seed(seed + 1))
        return model.eval(), text
    config = draw_config(arch, r)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    randomize_beyond_init(model, torch.Generator().manual_seed(seed))
    return model, config.to_dict()


def run_seed(seed: int, kiln: str, work: Path, keep: bool, glm5_next: bool,
             chunked: bool) -> tuple[str, str, str]:
    r = random.Random(seed)
    arch = "glm5_next" if glm5_next else r.choice(["deepseek_v3", "glm4_moe_lite", "glm_moe_dsa"])
    out_dir = Path(tempfile.mkdtemp(prefix=f"seed{seed}_", dir=work))
    try:
        torch.manual_seed(seed)
        try:
            model, text = build(arch, r, seed)
        except Exception as e:  # noqa: BLE001 - transformers refuses the config: nothing to compare
            return arch, "hf-refuses", str(e)[:200]
        dtype = r.choice([torch.float32, torch.bfloat16])
        prompt_len = r.choice([9, 40, 80] if glm5_next else [9, 24, 40])
        model.to(dtype).save_pretrained(out_dir)
        model = (glm5_next_fixtures.load_eager_fp32(out_dir) if glm5_next else
                 AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval())
        # Token 0 is glm5_next's pad token; the others' prompts may hold it.
        low = 1 if glm5_next else 0
        prompt = torch.randint(low, text["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(seed))
        try:
            with torch.no_grad():
                # An explicit mask: generate() would otherwise mask every prompt token equal to pad_token_id.
                hf = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=kNewTokens,
                                    do_sample=False, output_scores=True, return_dict_in_generate=True,
                                    eos_token_id=None, pad_token_id=0)
        except Exception as e:  # noqa: BLE001
            return arch, "hf-refuses", str(e)[:200]
        want = hf.sequences[0, prompt_len:].tolist()
        def kiln_tokens(*settings: str) -> subprocess.CompletedProcess:
            command = [kiln, "generate", "-m", str(out_dir), "--prompt-ids", ",".join(map(str, prompt[0].tolist())),
                       "-n", str(kNewTokens), "--no-stats", "--log-level", "error", "--set", "kv.layout=fp32"]
            for setting in settings:
                command += ["--set", setting]
            return subprocess.run(command, capture_output=True, text=True, timeout=300)

        proc = kiln_tokens()
        if proc.returncode != 0:
            return arch, "kiln-error", (proc.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
        got = [int(t) for t in proc.stdout.split()]
        if got == want:
            if chunked:  # the prompt 7 tokens a step over 16-token blocks: the same tokens
                again = kiln_tokens("scheduler.max_num_batched_tokens=7", "kv.block_size=16")
                if again.returncode != 0 or [int(t) for t in again.stdout.split()] != got:
                    return arch, "CHUNKING-DIFFERS", (again.stdout.strip() or again.stderr.strip())[-300:]
            return arch, "match", ""
        if len(got) != len(want):
            return arch, "MISMATCH", f"kiln {got} transformers {want}"
        step = next(i for i in range(len(got)) if got[i] != want[i])
        scores = hf.scores[step][0]
        behind = float(scores.max() - scores[got[step]])
        kind = "near-tie" if behind < kNearTie * max(1.0, float(scores.abs().max())) else "MISMATCH"
        if kind == "MISMATCH" and glm5_next and not text["index_kpool_always_select_tail"] and text["index_kpool"] > 1:
            kind = "empty-selection"
        if kind == "MISMATCH" and float64_tokens(out_dir, prompt, glm5_next) == got:
            # An intermediate decision (a router or indexer top-k) within fp32 rounding of a tie: transformers in
            # fp64 takes kiln's branch.
            kind = "fp64-agrees"
        detail = f"step {step}: kiln {got[step]}, transformers {want[step]} (kiln's token {behind:.3g} behind)"
        return arch, kind, detail
    finally:
        if not keep:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            print(f"  kept {out_dir}", file=sys.stderr)


def float64_tokens(out_dir: Path, prompt: torch.Tensor, glm5_next: bool) -> list[int]:
    """transformers' greedy tokens with every weight and activation in fp64 (its grouped expert GEMM has no fp64
    kernel: experts run eagerly)."""
    cls = Glm5NextForConditionalGeneration if glm5_next else AutoModelForCausalLM
    model = cls.from_pretrained(out_dir, dtype=torch.float64, attn_implementation="eager",
                                experts_implementation="eager").eval()
    with torch.no_grad():
        ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=kNewTokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return ids[0, prompt.shape[1]:].tolist()


def parse_seeds(text: str) -> range:
    if ":" in text:
        a, b = text.split(":")
        return range(int(a), int(b))
    return range(int(text), int(text) + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default="build/bin/kiln", help="the kiln binary")
    parser.add_argument("--seeds", default="0:50", help="A:B (half-open) or one seed")
    parser.add_argument("--keep", action="store_true", help="keep each checkpoint (its path goes to stderr)")
    parser.add_argument("--glm5-next", action="store_true", help="draw glm5_next (GLM-5.3-Flash) configs instead")
    parser.add_argument("--chunked", action="store_true",
                        help="also run each identical seed's prompt in 7-token chunks over 16-token blocks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()
    counts: dict[str, int] = {}
    work = Path(tempfile.mkdtemp(prefix="kiln_sweep_"))
    for seed in parse_seeds(args.seeds):
        arch, kind, detail = run_seed(seed, args.kiln, work, args.keep, args.glm5_next, args.chunked)
        counts[kind] = counts.get(kind, 0) + 1
        print(f"{seed} | {arch} | {kind} | {detail}", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    failed = counts.get("MISMATCH", 0) + counts.get("CHUNKING-DIFFERS", 0)
    return 1 if failed else 0  # the other classes are reported, not failures


if __name__ == "__main__":
    sys.exit(main())
