#!/usr/bin/env python3
"""Build tiny random GLM/DeepSeek checkpoints and dump transformers reference outputs.

The C++ CPU forward pass is compared against these fixtures (tests/data/models/<name>/):
config.json + model.safetensors written by save_pretrained, and reference.safetensors with
prompt ids, logits, per-layer hidden states and a KV-cached greedy continuation.

    python3 tools/make_reference.py            # (re)generate all fixtures
    python3 tools/make_reference.py --check    # reload every fixture and verify the references

Everything runs on CPU in float32 with eager attention; generation is seeded and single-threaded
so the same machine reproduces the files bit for bit. See tools/README.md for what each tensor
means and the transformers behaviour the C++ side has to match.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v3 import DeepseekV3Config
from transformers.models.glm4_moe_lite import Glm4MoeLiteConfig
from transformers.models.glm_moe_dsa import GlmMoeDsaConfig

kExpectedTransformers = "5.17.0"
kRepoRoot = Path(__file__).resolve().parent.parent
kFixtureRoot = kRepoRoot / "tests" / "data" / "models"
kPromptLen = 24
kPrompt2Len = 11
kNewTokens = 16

# Below these gaps a correct fp32 implementation could legitimately pick a different
# expert / DSA key / greedy token than transformers did, so a fixture with a smaller
# gap would make the C++ comparison flaky. Units: raw score / logit differences.
kMinRouterGap = 1e-4
kMinIndexerGap = 1e-4
kMinGreedyGap = 1e-3
kLmHeadGain = 2.5

# Trunk shapes shared by every fixture (the brief's "tiny" sizes).
kTrunk = dict(
    vocab_size=4096,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    initializer_range=0.1,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Fixture:
    name: str
    seed: int
    make_config: Callable[[], transformers.PreTrainedConfig]
    save_dtype: torch.dtype
    with_mtp: bool = False
    published_rope_scaling: bool = False
    # DSA: make indexer head 1 the exact negation of head 0 (see antipodal_indexer_heads).
    antipodal_indexer_heads: bool = False
    # Rewrites config.json after saving (another spelling of the same model; verified to load identically).
    edit_config: Callable[[dict], None] | None = None
    # DSA: top-k cuts inside exact ties of index scores are the point (what a new user's few-head checkpoint does):
    # exact ties are required to occur and reproduce exactly; only inexact near-ties are refused.
    exact_ties: bool = False


def glm4_moe_lite_config() -> Glm4MoeLiteConfig:
    return Glm4MoeLiteConfig(
        **kTrunk,
        mlp_layer_types=["dense", "sparse", "sparse"],
        routed_scaling_factor=1.8,
        n_group=1,
        topk_group=1,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        max_position_embeddings=2048,
    )


def glm_moe_dsa_config() -> GlmMoeDsaConfig:
    return GlmMoeDsaConfig(
        **kTrunk,
        first_k_dense_replace=1,
        routed_scaling_factor=1.8,
        n_group=1,
        topk_group=1,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        max_position_embeddings=2048,
        index_topk=8,
        index_head_dim=16,
        index_n_heads=8,
    )


def deepseek_v3_config() -> DeepseekV3Config:
    # A smaller vocabulary keeps tests/data/models under its 8 MB budget.
    return DeepseekV3Config(
        **{**kTrunk, "vocab_size": 512},
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        n_group=2,
        topk_group=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        num_mtp_layers=0,
    )


# DSA variants (tools/README.md, "DSA variant fixtures"): other indexer head counts and head dims, index_topk well
# below the prompt, 4 layers with non-prefix dense/sparse MLP patterns and shared indexer layers. A smaller vocabulary,
# MLPs and expert count and bf16 weights keep each one near 400 KB.
kDsaVariantTrunk = {**kTrunk, "vocab_size": 256, "num_hidden_layers": 4, "intermediate_size": 48,
                    "moe_intermediate_size": 16, "n_routed_experts": 4}


def glm_moe_dsa_variant_config(**overrides) -> Callable[[], GlmMoeDsaConfig]:
    def make() -> GlmMoeDsaConfig:
        args = dict(
            routed_scaling_factor=1.8,
            n_group=1,
            topk_group=1,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            max_position_embeddings=2048,
        )
        args.update(overrides)
        return GlmMoeDsaConfig(**kDsaVariantTrunk, **args)
    return make


def as_topk_pattern_and_first_k_dense(cfg: dict) -> None:
    """Write the indexer schedule as GLM's `index_topk_pattern` string and the MLP pattern as first_k_dense_replace
    only (what a published config may carry instead of 5.17's indexer_types / mlp_layer_types)."""
    cfg["index_topk_pattern"] = "".join("F" if t == "full" else "S" for t in cfg.pop("indexer_types"))
    types = cfg.pop("mlp_layer_types")
    cfg["first_k_dense_replace"] = types.index("sparse")
    assert types == ["dense"] * types.index("sparse") + ["sparse"] * (len(types) - types.index("sparse"))


def as_topk_freq_schedule(cfg: dict) -> None:
    """Leave the indexer schedule to index_topk_freq (and the default index_skip_topk_offset 2)."""
    assert "index_topk_freq" in cfg
    del cfg["indexer_types"]


# MLA + MoE config variants (tools/README.md, "Config variants"): the options of Glm4MoeLiteConfig and DeepseekV3Config
# the first three fixtures leave at one value, a few combined per fixture. Vocab 256, 3 layers, 8 experts of 16 and
# bf16 weights (fp32 where noted) keep each one near 300 KB. num_key_value_heads follows num_attention_heads (MLA
# repeats no KV heads: transformers' eager attention needs them equal).
kConfigVariantTrunk = {**kTrunk, "vocab_size": 256, "intermediate_size": 48, "moe_intermediate_size": 16}


def config_variant(cls, **overrides) -> Callable[[], transformers.PreTrainedConfig]:
    def make() -> transformers.PreTrainedConfig:
        args = {**kConfigVariantTrunk, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048}
        args.update(overrides)
        args["num_key_value_heads"] = args["num_attention_heads"]
        return cls(**args)
    return make


def as_moonlight_rope(cfg: dict) -> None:
    """Write rope as Moonlight-16B-A3B's config.json does (a deepseek_v3 with q_lora_rank null): a top-level
    rope_theta and `"rope_scaling": null`, plus its router keys that transformers ignores but kiln checks."""
    rope = cfg.pop("rope_parameters")
    assert rope["rope_type"] == "default"
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    cfg["scoring_func"] = "sigmoid"
    cfg["topk_method"] = "noaux_tc"


def as_first_k_dense_only(cfg: dict) -> None:
    """deepseek_v3 reads first_k_dense_replace alone; drop what 5.17 does not write for it anyway."""
    cfg.pop("mlp_layer_types", None)


kFixtures = [
    Fixture("glm4_moe_lite-tiny", 1001, glm4_moe_lite_config, torch.float32, with_mtp=True),
    Fixture("glm_moe_dsa-tiny", 2016, glm_moe_dsa_config, torch.bfloat16),
    Fixture("deepseek_v3-tiny", 3004, deepseek_v3_config, torch.float32, published_rope_scaling=True),
    # 5 heads of 32 (the first 8 values of each roped, 24 passed through), top-6, MLP dense/sparse/dense/sparse.
    Fixture("glm_moe_dsa-h5d32", 4010, glm_moe_dsa_variant_config(
        index_n_heads=5, index_head_dim=32, index_topk=6,
        mlp_layer_types=["dense", "sparse", "dense", "sparse"]), torch.bfloat16, antipodal_indexer_heads=True),
    # 3 heads of 16, top-8, indexer layers full/shared/shared/full written as index_topk_pattern "FSSF",
    # 2 dense layers written as first_k_dense_replace.
    Fixture("glm_moe_dsa-h3d16-shared", 5000, glm_moe_dsa_variant_config(
        index_n_heads=3, index_head_dim=16, index_topk=8, first_k_dense_replace=2,
        indexer_types=["full", "shared", "shared", "full"]), torch.bfloat16,
        antipodal_indexer_heads=True, edit_config=as_topk_pattern_and_first_k_dense),
    # 4 heads of 24, top-5, MLP sparse/dense/sparse/dense (layer 0 MoE), indexer schedule from index_topk_freq 2
    # (full, full, shared, full).
    Fixture("glm_moe_dsa-h4d24-freq", 6002, glm_moe_dsa_variant_config(
        index_n_heads=4, index_head_dim=24, index_topk=5, index_topk_freq=2,
        mlp_layer_types=["sparse", "dense", "sparse", "dense"]), torch.bfloat16,
        antipodal_indexer_heads=True, edit_config=as_topk_freq_schedule),
    # What a new user builds: 3 heads of 16, top-8 below the prompt, nothing arranged against ties. Many keys score
    # exactly 0 and top-k cuts fall inside those ties, where the selection is torch.topk's CPU procedure.
    Fixture("glm_moe_dsa-h3d16-ties", 7004, glm_moe_dsa_variant_config(
        index_n_heads=3, index_head_dim=16, index_topk=8), torch.bfloat16, exact_ties=True),
    # Config variants (tools/README.md, "Config variants").
    # 3 heads, queries projected directly (q_lora_rank null: q_proj), qk_nope 12 != v_head 20, 2 shared experts,
    # top-1 routing without renormalisation, every layer MoE (mlp_layer_types all sparse).
    Fixture("glm4_moe_lite-h3-qproj", 8003, config_variant(
        Glm4MoeLiteConfig, num_attention_heads=3, q_lora_rank=None, qk_nope_head_dim=12, v_head_dim=20,
        n_shared_experts=2, num_experts_per_tok=1, norm_topk_prob=False, routed_scaling_factor=2.0,
        mlp_layer_types=["sparse"] * 3, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), torch.bfloat16),
    # 5 heads, qk_rope 4 / nope 16 / v 8, 4 expert groups of 2 with the best 2 kept, top-3, no shared expert,
    # lm_head tied to the embedding, YaRN with mscale != mscale_all_dim (cos/sin × 1.0942, softmax scale × 1.2188).
    Fixture("glm4_moe_lite-h5-yarn-groups", 8104, config_variant(
        Glm4MoeLiteConfig, num_attention_heads=5, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=4,
        v_head_dim=8, n_group=4, topk_group=2, num_experts_per_tok=3, n_shared_experts=0, tie_word_embeddings=True,
        routed_scaling_factor=1.5, mlp_layer_types=["dense", "sparse", "sparse"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 16,
                         "beta_fast": 8, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5}), torch.bfloat16),
    # All layers dense (no router at all), rope on the natural layout (rope_interleave false: rotate-half), odd
    # number of rope pairs (qk_rope 6), 2 heads.
    Fixture("glm4_moe_lite-dense-halves", 8203, config_variant(
        Glm4MoeLiteConfig, num_attention_heads=2, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=12,
        mlp_layer_types=["dense"] * 3, rope_interleave=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}), torch.float32),
    # Moonlight-style deepseek_v3: q_lora_rank null, `"rope_scaling": null` + rope_theta 5e4, one group, 2 shared
    # experts, routed_scaling 2.446, first_k_dense_replace 1, 3 heads, qk_nope 16 != v_head 12.
    Fixture("deepseek_v3-qproj", 8304, config_variant(
        DeepseekV3Config, num_attention_heads=3, q_lora_rank=None, v_head_dim=12, n_group=1, topk_group=1,
        n_shared_experts=2, num_experts_per_tok=2, routed_scaling_factor=2.446, first_k_dense_replace=1,
        rms_norm_eps=1e-6, num_mtp_layers=0, rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
        torch.bfloat16, edit_config=as_moonlight_rope),
    # DeepSeek-V2-Lite's rope_scaling (mscale = mscale_all_dim = 0.707: cos/sin unscaled, softmax scale × m²), written
    # as published; every layer MoE (first_k_dense_replace 0), 4 groups top-2, top-3 without renormalisation,
    # routed_scaling 1.0, 5 heads, qk_rope 4.
    Fixture("deepseek_v3-v2lite-yarn", 8409, config_variant(
        DeepseekV3Config, num_attention_heads=5, qk_rope_head_dim=4, v_head_dim=20, n_group=4, topk_group=2,
        num_experts_per_tok=3, norm_topk_prob=False, routed_scaling_factor=1.0, first_k_dense_replace=0,
        rms_norm_eps=1e-6, num_mtp_layers=0, max_position_embeddings=640,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
        torch.bfloat16, published_rope_scaling=True, edit_config=as_first_k_dense_only),
    # All dense (first_k_dense_replace 5 > 3 layers), tied lm_head, YaRN with mscale only (attention_factor from
    # factor alone, softmax scale unchanged), 4 heads, the class default n_group 8 (no router runs).
    Fixture("deepseek_v3-dense-tied", 8506, config_variant(
        DeepseekV3Config, num_attention_heads=4, first_k_dense_replace=5, tie_word_embeddings=True,
        rms_norm_eps=1e-6, num_mtp_layers=0, max_position_embeddings=512,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 64,
                         "mscale": 1.0}),
        torch.bfloat16, published_rope_scaling=True, edit_config=as_first_k_dense_only),
    # Linear position interpolation written as published (`"rope_scaling": {"type": "linear", "factor": 4}`): every
    # frequency divided by 4, cos/sin and the softmax scale unscaled. 2 heads, dense then MoE ×2.
    Fixture("deepseek_v3-linear-rope", 8607, config_variant(
        DeepseekV3Config, num_attention_heads=2, first_k_dense_replace=1, n_group=1, topk_group=1,
        rms_norm_eps=1e-6, num_mtp_layers=0, max_position_embeddings=512,
        rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}),
        torch.float32, published_rope_scaling=True, edit_config=as_first_k_dense_only),
    # Llama 3's frequency-band rope (factor 8, low 1 / high 4 over an original context of 64): with θ 1e4 and 4 pairs
    # the wavelengths are 6.3 (kept), 62.8 (blended), 628 and 6283 (divided by 8), so all three bands run.
    Fixture("glm4_moe_lite-llama3-rope", 8708, config_variant(
        Glm4MoeLiteConfig, num_attention_heads=4, mlp_layer_types=["dense", "sparse", "sparse"],
        rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), torch.bfloat16),
]


# ----------------------------------------------------------------------------- model building


def randomize_beyond_init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Make norms, router biases and indexer LayerNorms non-trivial.

    transformers initialises RMSNorm weights to 1 and e_score_correction_bias to 0, which would let
    a C++ implementation that forgot to apply them still pass.
    """
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=gen))
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=gen))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
            if hasattr(module, "e_score_correction_bias"):
                bias = module.e_score_correction_bias
                bias.copy_(0.1 * torch.randn(bias.shape, generator=gen))
        # A sharper output distribution widens the greedy top-1/top-2 gaps (see kMinGreedyGap). A tied lm_head is the
        # embedding: scaling it would scale the residual stream too and make greedy decoding repeat the last token.
        if not model.config.tie_word_embeddings:
            model.lm_head.weight.mul_(kLmHeadGain)


def antipodal_indexer_heads(model: torch.nn.Module) -> None:
    """Indexer head 1's query rows = −(head 0's), in every indexer.

    With few heads, many keys get index score exactly 0 (ReLU is 0 for every head) and the top-k boundary falls
    inside such a tie, where torch.topk's choice is implementation-defined. RoPE is linear, so head 1's query stays
    the negation of head 0's after it and, for every key, exactly one of the two heads has a positive logit (unless
    it is exactly 0): no key scores exactly 0 any more, while ReLU still decides which head counts.
    """
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("Indexer"):
                d = module.head_dim
                module.wq_b.weight[d:2 * d].copy_(-module.wq_b.weight[:d])


def load_eager_fp32(path: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def build_checkpoint(fixture: Fixture, out_dir: Path) -> None:
    torch.manual_seed(fixture.seed)
    gen = torch.Generator().manual_seed(fixture.seed + 1)
    config = fixture.make_config()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_beyond_init(model, gen)
    if fixture.antipodal_indexer_heads:
        antipodal_indexer_heads(model)
    model.eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        stale.unlink()
    if fixture.save_dtype == torch.float32:
        model.save_pretrained(out_dir)
    else:
        # Round-trip through from_pretrained(dtype=...) so the file holds exactly what a bf16
        # checkpoint loaded by transformers holds (modules it keeps in fp32 stay fp32).
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            low = AutoModelForCausalLM.from_pretrained(tmp, dtype=fixture.save_dtype)
            low.save_pretrained(out_dir)
    (out_dir / "generation_config.json").unlink(missing_ok=True)

    if fixture.with_mtp:
        add_mtp_layer(fixture, out_dir, gen)
    if fixture.published_rope_scaling:
        rewrite_rope_as_published(out_dir)
    if fixture.edit_config:
        cfg_path = out_dir / "config.json"
        cfg = json.loads(cfg_path.read_text())
        fixture.edit_config(cfg)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def add_mtp_layer(fixture: Fixture, out_dir: Path, gen: torch.Generator) -> None:
    """Append a random DeepSeek-style MTP layer at index num_hidden_layers (not an HF module).

    The decoder block's tensors come from a (num_hidden_layers + 1)-layer model saved by
    transformers, so their names and on-disk layout are exactly those of a trunk MoE layer.
    """
    config = fixture.make_config()
    n = config.num_hidden_layers
    bigger = fixture.make_config()
    bigger.num_hidden_layers = n + 1
    bigger.mlp_layer_types = list(config.mlp_layer_types) + ["sparse"]
    torch.manual_seed(fixture.seed + 2)
    donor = AutoModelForCausalLM.from_config(bigger, attn_implementation="eager", dtype=torch.float32)
    randomize_beyond_init(donor, gen)
    with tempfile.TemporaryDirectory() as tmp:
        donor.save_pretrained(tmp)
        donor_tensors = load_file(str(Path(tmp) / "model.safetensors"))

    prefix = f"model.layers.{n}."
    tensors = load_file(str(out_dir / "model.safetensors"))
    for key, value in donor_tensors.items():
        if key.startswith(prefix):
            tensors[key] = value.contiguous()
    hidden = config.hidden_size
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{prefix}{norm}.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    tensors[f"{prefix}eh_proj.weight"] = config.initializer_range * torch.randn(hidden, 2 * hidden, generator=gen)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_nextn_predict_layers"] = 1
    # Published GLM-4.7-Flash configs carry first_k_dense_replace; 5.17 saves mlp_layer_types.
    cfg["first_k_dense_replace"] = config.mlp_layer_types.index("sparse")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def rewrite_rope_as_published(out_dir: Path) -> None:
    """Replace 5.17's `rope_parameters` with the top-level rope_theta + rope_scaling of published configs."""
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    cfg["rope_scaling"] = rope
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- references


def causal_additive_mask(n: int) -> torch.Tensor:
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)
    return mask[None, None]


def greedy_with_cache(model, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """16 greedy tokens: the first from the cached prefill, then one single-token step each."""
    out = model(input_ids=prompt[None], use_cache=True)
    cache = out.past_key_values
    step_logits = out.logits[0, -1]
    ids, logits = [], []
    for _ in range(kNewTokens):
        token = int(step_logits.argmax())
        ids.append(token)
        logits.append(step_logits.clone())
        if len(ids) == kNewTokens:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        step_logits = out.logits[0, -1]
    return torch.tensor(ids, dtype=torch.int32), torch.stack(logits)


def prompt_ids(fixture: Fixture) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(fixture.seed + 7)
    vocab = fixture.make_config().vocab_size
    prompt = torch.randint(0, vocab, (kPromptLen,), generator=gen)
    prompt2 = torch.randint(0, vocab, (kPrompt2Len,), generator=gen)
    return prompt, prompt2


def mtp_logits(model, path: Path, prompt: torch.Tensor, final_hidden: torch.Tensor) -> torch.Tensor:
    """MTP logits for prompt positions 0..T-2, computed from models.md §MTP.

    Row i: e = enorm(embed(t[i+1])); h = hnorm(h_i) where h_i is the trunk's hidden state AFTER the
    final norm (what transformers' MtpModel and vLLM feed the MTP layer); z = eh_proj([e, h]);
    z' = DecoderLayer(z) causally over rows 0..i at positions i+1; logits = lm_head(shared_head.norm(z')).
    """
    config = model.config
    n = config.num_hidden_layers
    prefix = f"model.layers.{n}."
    tensors = {k[len(prefix):]: v.float() for k, v in load_file(str(path / "model.safetensors")).items()
               if k.startswith(prefix)}

    block_config = type(config)(**{**config.to_dict(), "num_hidden_layers": 1, "mlp_layer_types": ["sparse"]})
    block_config._attn_implementation = "eager"
    block_cls = type(model.model.layers[-1])
    block = block_cls(block_config, layer_idx=0).eval()
    state = {}
    experts = config.n_routed_experts
    for key, value in tensors.items():
        if key.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head.")) or key.startswith("mlp.experts."):
            continue
        state[key] = value
    state["mlp.experts.gate_up_proj"] = torch.stack([
        torch.cat([tensors[f"mlp.experts.{e}.gate_proj.weight"], tensors[f"mlp.experts.{e}.up_proj.weight"]])
        for e in range(experts)])
    state["mlp.experts.down_proj"] = torch.stack([tensors[f"mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    missing, unexpected = block.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"MTP block load mismatch: missing={missing} unexpected={unexpected}")

    eps = config.rms_norm_eps

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    t = prompt.numel() - 1
    embeds = model.model.embed_tokens(prompt[1:][None])
    hidden = final_hidden[: t][None]
    z = torch.cat([rms(embeds, tensors["enorm.weight"]), rms(hidden, tensors["hnorm.weight"])], dim=-1)
    z = z @ tensors["eh_proj.weight"].T
    positions = torch.arange(1, t + 1)[None]
    rope = model.model.rotary_emb(z, positions)
    out = block(z, attention_mask=causal_additive_mask(t), position_ids=positions, position_embeddings=rope)
    return model.lm_head(rms(out, tensors["shared_head.norm.weight"]))[0]


def mtp_logits_via_transformers(model, prompt: torch.Tensor, final_hidden: torch.Tensor) -> torch.Tensor:
    """Same rows through transformers' own MtpModel (its weight renaming and layer), as a cross-check."""
    from transformers.modeling_layers import MtpModel

    n = model.config.num_hidden_layers
    model.config.num_mtp_layers = 1
    model.config.mtp_mlp_layer_types = ["sparse"]
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n}\..*"]
    mtp = MtpModel.from_pretrained(model).eval()
    t = prompt.numel() - 1
    embeds = mtp.embed_tokens(prompt[1:][None])
    positions = torch.arange(1, t + 1)[None]
    rope = mtp.rotary_emb(embeds, positions)
    out = mtp.layers[0](embeds, final_hidden[:t][None], position_embeddings=rope,
                        attention_mask=causal_additive_mask(t), position_ids=positions, past_key_values=None)
    return mtp._project_to_logits(out)[0]


def compute_references(fixture: Fixture, path: Path) -> dict[str, torch.Tensor]:
    model = load_eager_fp32(path)
    prompt, prompt2 = prompt_ids(fixture)
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(lambda m, a, o: captured.__setitem__("last", o))
    with torch.no_grad():
        out = model(input_ids=prompt[None], output_hidden_states=True, use_cache=False)
        hook.remove()
        refs = {
            "prompt_ids": prompt.to(torch.int32),
            "prefill_logits": out.logits[0],
            "hidden_states": torch.stack([h[0] for h in out.hidden_states]),
            "last_layer_prenorm": (captured["last"][0] if isinstance(captured["last"], tuple) else captured["last"])[0],
        }
        refs["greedy_ids"], refs["decode_logits"] = greedy_with_cache(model, prompt)
        refs["prompt2_ids"] = prompt2.to(torch.int32)
        refs["prompt2_logits"] = model(input_ids=prompt2[None], use_cache=False).logits[0]
        if fixture.with_mtp:
            refs["mtp_logits"] = mtp_logits(model, path, prompt, refs["hidden_states"][-1])
    return {k: v.contiguous().clone() for k, v in refs.items()}


# ----------------------------------------------------------------------------- robustness checks


def topk_gap(scores: torch.Tensor, k: int, exact_ties_allowed: bool = False) -> float:
    """Smallest gap between the k-th and (k+1)-th value over rows (inf when a row has <= k finite values).
    With exact_ties_allowed, rows whose cut falls inside an exact tie are left out (counted in kExactTies)."""
    finite = torch.isfinite(scores) & (scores > torch.finfo(torch.float32).min / 2)
    best = float("inf")
    for row, ok in zip(scores, finite):
        vals = row[ok].sort(descending=True).values
        if vals.numel() > k:
            gap = float(vals[k - 1] - vals[k])
            if exact_ties_allowed and gap == 0.0:
                kExactTies[0] += 1
                continue
            best = min(best, gap)
    return best


kExactTies = [0]  # rows whose top-k cut fell inside an exact tie (fixtures with exact_ties)


def decision_gaps(model, sequences: list[torch.Tensor], exact_ties: bool = False) -> dict[str, float]:
    """Margins of every discrete choice the forward pass makes (expert groups, experts, DSA keys).

    Recomputed independently from the module weights and inputs; the DSA top-k sets are also
    compared with the indices transformers chose, so this doubles as a check of the indexer facts
    written in tools/README.md.
    """
    gaps = {"router_group": float("inf"), "router_expert": float("inf"), "indexer": float("inf")}
    hooks = []

    def router_hook(module, args, _out):
        x = args[0].reshape(-1, module.hidden_dim).float()
        scores = torch.sigmoid(x @ module.weight.float().T)
        choice = scores + module.e_score_correction_bias
        if module.num_group > 1:
            groups = choice.view(x.shape[0], module.num_group, -1)
            group_scores = groups.topk(2, dim=-1).values.sum(-1)
            gaps["router_group"] = min(gaps["router_group"], topk_gap(group_scores, module.topk_group))
            keep = group_scores.topk(module.topk_group, dim=-1).indices
            mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~mask.repeat_interleave(groups.shape[-1], dim=1), float("-inf"))
        gaps["router_expert"] = min(gaps["router_expert"], topk_gap(choice, module.top_k))

    def indexer_hook(module, args, kwargs, out):
        names = ["hidden_states", "q_resid", "position_embeddings", "attention_mask"]
        vals = dict(zip(names, args))
        vals.update({k: v for k, v in kwargs.items() if k in names})
        x, q_resid = vals["hidden_states"][0], vals["q_resid"][0]
        cos, sin = vals["position_embeddings"]
        cos, sin = cos[0, :, : cos.shape[-1] // 2], sin[0, :, : sin.shape[-1] // 2]
        r = module.qk_rope_head_dim

        def rope(v):  # interleaved pairs (2i, 2i+1), rope slice first
            a, b = v[..., 0:r:2], v[..., 1:r:2]
            c, s = (cos, sin) if v.dim() == 2 else (cos[:, None], sin[:, None])
            return torch.cat([a * c - b * s, b * c + a * s, v[..., r:]], dim=-1)

        t = x.shape[0]
        q = rope((q_resid @ module.wq_b.weight.T).view(t, module.n_heads, module.head_dim))
        k = rope(module.k_norm(x @ module.wk.weight.T))
        w = (x @ module.weights_proj.weight.float().T) * module.n_heads ** -0.5
        per_head = torch.relu(torch.einsum("shd,td->sht", q, k) * module.head_dim ** -0.5)
        index = torch.einsum("sh,sht->st", w, per_head)
        index = index.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        kk = min(module.index_topk, t)
        mine = index.topk(kk, dim=-1).indices
        for s in range(t):
            # Inside an exact tie the choice is torch's (the C++ side follows it, see topk.h); compare the rest.
            if exact_ties and s + 1 > kk and index[s].sort(descending=True).values[kk - 1] == \
                    index[s].sort(descending=True).values[kk]:
                continue
            if s + 1 > kk and set(mine[s].tolist()) != set(out[0, s].tolist()):
                raise AssertionError(f"indexer re-derivation disagrees with transformers at query {s}")
        gaps["indexer"] = min(gaps["indexer"], topk_gap(index, module.index_topk, exact_ties))

    for module in model.modules():
        if type(module).__name__.endswith("TopkRouter"):
            hooks.append(module.register_forward_hook(router_hook))
        if type(module).__name__.endswith("Indexer"):
            hooks.append(module.register_forward_hook(indexer_hook, with_kwargs=True))
    try:
        with torch.no_grad():
            for seq in sequences:
                model(input_ids=seq[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return gaps


def greedy_with_bf16_latents(model, prompt: torch.Tensor) -> torch.Tensor:
    """greedy_with_cache with every cached latent (kv_a_layernorm output and roped k_pe) rounded to bf16, as kiln's
    bf16 KV layout stores them: tests/model/reference_model_test.cpp holds that layout to the same greedy tokens."""
    from transformers import DynamicCache

    update = DynamicCache.update

    def rounded(self, k, v, layer_idx, *args, **kwargs):
        return update(self, k.to(torch.bfloat16).float(), v.to(torch.bfloat16).float(), layer_idx, *args, **kwargs)

    DynamicCache.update = rounded
    try:
        return greedy_with_cache(model, prompt)[0]
    finally:
        DynamicCache.update = update


def check_margins(fixture: Fixture, path: Path, refs: dict[str, torch.Tensor]) -> dict[str, float]:
    model = load_eager_fp32(path)
    # MLA latents only: the DSA models' cache holds expanded keys and values, which kiln does not store.
    if not any(type(m).__name__.endswith("Indexer") for m in model.modules()):
        with torch.no_grad():
            bf16_greedy = greedy_with_bf16_latents(model, refs["prompt_ids"].long())
        if not torch.equal(bf16_greedy, refs["greedy_ids"]):
            raise AssertionError(f"{fixture.name}: bf16-rounded cached latents change the greedy tokens "
                                 f"({bf16_greedy.tolist()} vs {refs['greedy_ids'].tolist()}); pick another seed")
    full = torch.cat([refs["prompt_ids"], refs["greedy_ids"][:-1]]).long()
    kExactTies[0] = 0
    gaps = decision_gaps(model, [full, refs["prompt2_ids"].long()], fixture.exact_ties)
    if fixture.exact_ties:
        if kExactTies[0] == 0:
            raise AssertionError(f"{fixture.name}: no top-k cut fell inside an exact tie; pick another seed")
        gaps["indexer_exact_tie_rows"] = kExactTies[0]
    top2 = refs["decode_logits"].topk(2, dim=-1).values
    gaps["greedy"] = float((top2[:, 0] - top2[:, 1]).min())
    limits = {"router_group": kMinRouterGap, "router_expert": kMinRouterGap,
              "indexer": kMinIndexerGap, "greedy": kMinGreedyGap}
    for key, limit in limits.items():
        if gaps[key] < limit:
            raise AssertionError(f"{fixture.name}: {key} decision gap {gaps[key]:.3g} < {limit:g}; pick another seed")
    return gaps


# ----------------------------------------------------------------------------- checkpoint checks


def logits_of(model, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=prompt[None], use_cache=False).logits[0]


def verify_checkpoint_forms(fixture: Fixture, path: Path) -> None:
    """The edits made to config.json / model.safetensors must not change what transformers computes."""
    prompt, _ = prompt_ids(fixture)
    cfg = json.loads((path / "config.json").read_text())
    model = load_eager_fp32(path)
    logits = logits_of(model, prompt)

    if fixture.published_rope_scaling:
        assert "rope_scaling" in cfg and "rope_parameters" not in cfg, "config.json should use rope_scaling"
        rope = model.config.rope_parameters
        want = fixture.make_config().rope_parameters
        assert rope["rope_type"] == want["rope_type"] and rope["factor"] == want["factor"], f"rope_scaling not honoured: {rope}"
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)  # 5.17 writes rope_parameters back
            assert "rope_parameters" in json.loads((Path(tmp) / "config.json").read_text())
            same = logits_of(load_eager_fp32(Path(tmp)), prompt)
        assert torch.equal(logits, same), "rope_scaling and rope_parameters forms give different logits"
    elif not fixture.edit_config:
        assert "rope_parameters" in cfg and "rope_scaling" not in cfg, "config.json should use rope_parameters"

    if fixture.edit_config:
        # The rewritten config.json must describe the model the fixture was built from.
        made = fixture.make_config()
        for key in ("indexer_types", "mlp_layer_types", "layer_types"):
            got, want = getattr(model.config, key, None), getattr(made, key, None)
            assert got == want, f"{fixture.name}: config.json reloads {key} = {got}, built with {want}"
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)  # 5.17's own spelling of the same config
            same = logits_of(load_eager_fp32(Path(tmp)), prompt)
        assert torch.equal(logits, same), "the edited config.json and 5.17's spelling give different logits"

    if fixture.with_mtp:
        n = model.config.num_hidden_layers
        names = load_file(str(path / "model.safetensors")).keys()
        assert any(k.startswith(f"model.layers.{n}.") for k in names), "MTP tensors missing"
        assert cfg.get("num_nextn_predict_layers") == 1
        with tempfile.TemporaryDirectory() as tmp:
            tensors = {k: v for k, v in load_file(str(path / "model.safetensors")).items()
                       if not k.startswith(f"model.layers.{n}.")}
            save_file(tensors, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
            (Path(tmp) / "config.json").write_text((path / "config.json").read_text())
            without_mtp = logits_of(load_eager_fp32(Path(tmp)), prompt)
        assert torch.equal(logits, without_mtp), "MTP tensors changed the trunk's logits"


# ----------------------------------------------------------------------------- driver


def reference_metadata(fixture: Fixture) -> dict[str, str]:
    # One key holding sorted JSON: safetensors writes metadata keys in hash order, and a
    # byte-stable file keeps regeneration from showing up as a git diff.
    info = {
        "generator": "tools/make_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": fixture.seed,
        "weights_dtype": str(fixture.save_dtype).removeprefix("torch."),
    }
    return {"info": json.dumps(info, sort_keys=True)}


def generate(fixture: Fixture) -> None:
    path = kFixtureRoot / fixture.name
    build_checkpoint(fixture, path)
    verify_checkpoint_forms(fixture, path)
    refs = compute_references(fixture, path)
    if fixture.with_mtp:
        model = load_eager_fp32(path)
        with torch.no_grad():
            via_hf = mtp_logits_via_transformers(model, refs["prompt_ids"].long(), refs["hidden_states"][-1])
        err = float((via_hf - refs["mtp_logits"]).abs().max() / refs["mtp_logits"].abs().max())
        if err > 1e-6:
            raise AssertionError(f"MTP reference disagrees with transformers' MtpModel: rel err {err:.3g}")
    gaps = check_margins(fixture, path, refs)
    save_file(refs, str(path / "reference.safetensors"), metadata=reference_metadata(fixture))
    spread = refs["prefill_logits"].std(dim=-1).mean()
    print(f"{fixture.name}: wrote {path.relative_to(kRepoRoot)}; logits std {spread:.3f}; "
          + ", ".join(f"min {k} gap {v:.3g}" for k, v in gaps.items()))


def check(fixture: Fixture) -> bool:
    path = kFixtureRoot / fixture.name
    saved = load_file(str(path / "reference.safetensors"))
    verify_checkpoint_forms(fixture, path)
    fresh = compute_references(fixture, path)
    ok = saved.keys() == fresh.keys()
    if not ok:
        print(f"{fixture.name}: tensor names differ: {sorted(saved)} vs {sorted(fresh)}")
    for key in sorted(saved.keys() & fresh.keys()):
        a, b = saved[key], fresh[key]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            diff = (a.float() - b.float()).abs().max() if a.shape == b.shape else float("nan")
            print(f"{fixture.name}: {key} differs (shape {tuple(a.shape)} vs {tuple(b.shape)}, max|diff| {diff})")
            ok = False
    print(f"{fixture.name}: {'OK' if ok else 'MISMATCH'} ({len(saved)} tensors)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify committed fixtures instead of writing them")
    parser.add_argument("--only", choices=[f.name for f in kFixtures], action="append",
                        help="restrict to one fixture (repeatable)")
    args = parser.parse_args()

    if transformers.__version__ != kExpectedTransformers:
        print(f"need transformers=={kExpectedTransformers}, found {transformers.__version__}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()

    fixtures = [f for f in kFixtures if not args.only or f.name in args.only]
    if args.check:
        return 0 if all([check(f) for f in fixtures]) else 1
    for fixture in fixtures:
        generate(fixture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
