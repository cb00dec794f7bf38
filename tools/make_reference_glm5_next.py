#!/usr/bin/env python3
"""Build tiny random glm5_next (GLM-5.3-Flash) checkpoints and dump transformers reference outputs.

The C++ CPU forward pass of core/src/model/arch/glm5_next is compared against these fixtures
(tests/data/models/glm5_next-*/): config.json, model.safetensors and reference.safetensors with
the prompt ids, prefill logits, a KV-cached greedy continuation and a second prompt's logits,
in the same format as tools/make_reference.py's fixtures.

    python3 tools/make_reference_glm5_next.py            # (re)generate every glm5_next fixture
    python3 tools/make_reference_glm5_next.py --check    # reload each fixture, recompute, compare exactly

Everything runs on CPU in float32 with eager attention, seeded and single-threaded. The three
fixtures store their weights under the three names a loader meets (tools/README.md):
transformers' save_pretrained form, transformers' in-memory (state_dict) form, and the original
flat `model.layers.*` form, renamed and split here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.glm5_next import Glm5NextConfig, Glm5NextForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_reference import kExpectedTransformers, kMinGreedyGap, kMinRouterGap, topk_gap  # noqa: E402

kRepoRoot = Path(__file__).resolve().parent.parent
kFixtureRoot = kRepoRoot / "tests" / "data" / "models"
# Longer than one KDA chunk (64) so transformers' chunked prefill crosses a chunk boundary, and far past
# index_topk so pooling, top-k and the tail all decide.
kPromptLen = 80
kPrompt2Len = 23
kNewTokens = 12
kMinIndexerGap = 1e-4
kLmHeadGain = 2.5

# The vision tower is loaded by transformers but never runs on text prompts; kiln ignores its weights.
kTinyVision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32,
                   projection_intermediate_size=16)

kTrunk = dict(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    initializer_range=0.1,
    # Nothing in the text model reads positions (NoPE); a small limit keeps the engine's default max_model_len,
    # and so the CPU's KV pool, small for recipes that set none.
    max_position_embeddings=4096,
    pad_token_id=0,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Fixture:
    name: str
    seed: int
    text: dict               # text-config fields (beyond kTrunk) as config.json will carry them
    names: str               # "save_pretrained" | "state_dict" | "flat_original"
    flat_config: bool = False  # text fields at the top level of config.json (no text_config)
    tokenizer: bool = False    # a tokenizer.json cut to the vocabulary, for `kiln generate` end to end
    notes: list[str] = field(default_factory=list)


K, D = "linear_attention", "deepseek_sparse_attention"

kFixtures = [
    # The production schedule scaled down: layer_types / mlp_layer_types / indexer_types left to
    # transformers' defaults (i % 4 == 3 → DSA; layers 0–2 dense; every indexer full).
    Fixture("glm5_next-tiny", 1109, dict(
        num_hidden_layers=8, linear_num_heads=2, linear_head_dim=16, linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0, hc_mult=4, index_n_heads=8, index_head_dim=16, index_kpool=4, index_topk=8),
        names="save_pretrained", tokenizer=True),
    # Another schedule: DSA layers back to back with a `shared` indexer, `full_attention` (the legacy
    # alias of DSA), MoE in layer 0, hc_mult 2, pools of 16, no forget-gate lower bound (softplus decay).
    Fixture("glm5_next-shared", 2206, dict(
        num_hidden_layers=6, layer_types=[K, D, D, K, "full_attention", K],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse", "dense", "sparse"],
        indexer_types=["full", "full", "shared", "full", "full", "full"],
        linear_num_heads=4, linear_head_dim=8, linear_conv_kernel_dim=4, linear_lower_bound=None,
        hc_mult=2, index_n_heads=8, index_head_dim=32, index_kpool=16, index_topk=32),
        names="state_dict"),
    # The original release's form: text fields at the top level of config.json, the legacy keys
    # (linear_attn_config, index_topk_freq / index_skip_topk_offset) and flat original tensor names.
    Fixture("glm5_next-flat", 3302, dict(
        num_hidden_layers=6, layer_types=[K, D, D, K, K, D],
        mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse", "sparse"],
        linear_attn_config=dict(head_dim=16, num_heads=3, short_conv_kernel_size=3, gate_lower_bound=None,
                                safe_gate=True),
        index_topk_freq=2, index_skip_topk_offset=2,
        hc_mult=3, index_n_heads=8, index_head_dim=16, index_kpool=4, index_topk=12),
        names="flat_original", flat_config=True),
    # Three heads everywhere (DSA, KDA) and hc_mult 4: tensor parallelism over 2 ranks splits every head count
    # unevenly (1 and 2) and over 3 ranks gives each rank one (tests/model/glm5_next_tensor_parallel_test.cpp).
    Fixture("glm5_next-h3", 4421, dict(
        num_attention_heads=3, num_key_value_heads=3,
        num_hidden_layers=4, layer_types=[K, D, K, D], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        linear_num_heads=3, linear_head_dim=8, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
        hc_mult=4, index_n_heads=8, index_head_dim=16, index_kpool=4, index_topk=8),
        names="save_pretrained"),
    # Four heads everywhere (DSA, KDA, indexer) and 8 experts: decode-context parallelism inside tensor
    # parallelism (parallel.tensor = 4, decode_context = 2: two groups of two) and groups of four
    # (tests/model/glm5_next_decode_context_test.cpp). A shared indexer right after a full one, hc_mult 2.
    Fixture("glm5_next-h4", 5551, dict(
        num_attention_heads=4, num_key_value_heads=4,
        num_hidden_layers=4, layer_types=[D, D, K, D], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        indexer_types=["full", "shared", "full", "full"],
        linear_num_heads=4, linear_head_dim=8, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
        hc_mult=2, index_n_heads=4, index_head_dim=16, index_kpool=4, index_topk=8),
        names="save_pretrained"),
]


# ----------------------------------------------------------------------------- configs


def config_json(fixture: Fixture) -> dict:
    text = dict(kTrunk, **fixture.text)
    if fixture.flat_config:
        return dict(text, model_type="glm5_next", architectures=["Glm5NextForConditionalGeneration"],
                    vision_config=dict(kTinyVision))
    return dict(model_type="glm5_next", architectures=["Glm5NextForConditionalGeneration"],
                text_config=dict(text, model_type="glm5_next_text"), vision_config=dict(kTinyVision),
                tie_word_embeddings=False)


def make_config(fixture: Fixture) -> Glm5NextConfig:
    cfg = dict(config_json(fixture))
    cfg.pop("model_type")
    cfg.pop("architectures")
    if "text_config" in cfg:
        cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "model_type"}
    return Glm5NextConfig(**cfg)


# ----------------------------------------------------------------------------- weights


def randomize_beyond_init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Give every parameter transformers initialises to a constant a random value, so a C++ path that
    forgot one (norm weights, router bias, mHC base / scale, the k-pool ape / gate, A_log) cannot pass."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.visual"):
                continue
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("k_norm.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif leaf == "base":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif leaf == "scale":
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif leaf == "fn":
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif leaf == "A_log":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif leaf == "index_kpool_compress_ape":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif leaf == "index_kpool_compress_gate":
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif leaf == "weight" and "conv1d" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                b = module.e_score_correction_bias
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
        model.lm_head.weight.mul_(kLmHeadGain)


# The original release's leaf names (transformers' conversion_mapping for glm5_next, reversed).
kOriginalRenames = [
    (r"\.self_attn\.forget_gate\.(f_a_proj|f_b_proj)\.", r".self_attn.\1."),
    (r"\.self_attn\.forget_gate\.(dt_bias|A_log)$", r".self_attn.\1"),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
]


def to_flat_original(state: dict[str, torch.Tensor], hc_dim: int) -> dict[str, torch.Tensor]:
    """transformers' in-memory names → the original flat checkpoint: model.layers.*, per-expert
    gate/up/down, q/k/v_conv1d, f_a/f_b/dt_bias/A_log under self_attn, hc_{attn,ffn}_*."""
    out = {}
    for name, t in state.items():
        if name.startswith("model.visual."):
            continue
        name = name.replace("model.language_model.", "model.", 1)
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
            continue
        if name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
            continue
        if name.endswith("self_attn.conv1d.weight"):
            base = name[: -len("conv1d.weight")]
            for i, part in enumerate("qkv"):
                out[f"{base}{part}_conv1d.weight"] = t[i * hc_dim:(i + 1) * hc_dim].contiguous()
            continue
        for pattern, repl in kOriginalRenames:
            name = re.sub(pattern, repl, name)
        out[name] = t.contiguous()
    return out


def load_eager_fp32(path: Path) -> torch.nn.Module:
    model = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def build_model(fixture: Fixture) -> torch.nn.Module:
    torch.manual_seed(fixture.seed)
    gen = torch.Generator().manual_seed(fixture.seed + 1)
    model = Glm5NextForConditionalGeneration._from_config(make_config(fixture), attn_implementation="eager",
                                                         dtype=torch.float32)
    randomize_beyond_init(model, gen)
    return model.eval()


def write_checkpoint(fixture: Fixture, model, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        stale.unlink()
    if fixture.names == "save_pretrained":
        model.save_pretrained(out_dir)
        (out_dir / "generation_config.json").unlink(missing_ok=True)
    else:
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if fixture.names == "flat_original":
            text = model.config.text_config
            state = to_flat_original(state, text.linear_num_heads * text.linear_head_dim)
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config_json(fixture), indent=2, sort_keys=True) + "\n")


def check_flat_names(model, path: Path) -> None:
    """transformers does not read the flat original names into Glm5NextForConditionalGeneration, so the
    renaming is checked tensor by tensor instead: every text tensor is there, split or renamed, bit for bit."""
    text = model.config.text_config
    state = {k: v.detach() for k, v in model.state_dict().items() if not k.startswith("model.visual.")}
    written = load_file(str(path / "model.safetensors"))
    expected = to_flat_original(state, text.linear_num_heads * text.linear_head_dim)
    if expected.keys() != written.keys() or not all(torch.equal(expected[k], written[k]) for k in expected):
        raise AssertionError("the flat original checkpoint does not hold the model's tensors")
    if not any(k.startswith("model.layers.") for k in written) or any("language_model" in k for k in written):
        raise AssertionError("the flat original checkpoint should use model.layers.* names")


def write_tokenizer(out_dir: Path) -> None:
    """glm4_moe_lite-tiny's byte-level BPE cut to this vocabulary: the 256 byte tokens and the first merges,
    then its special tokens renumbered to the last ids (text decodes; the model is random, so nothing reads well)."""
    tok = json.loads((kFixtureRoot / "glm4_moe_lite-tiny" / "tokenizer.json").read_text())
    vocab = kTrunk["vocab_size"]
    added = tok["added_tokens"]
    keep = vocab - len(added)
    tok["model"]["vocab"] = {k: i for k, i in tok["model"]["vocab"].items() if i < keep}
    tok["model"]["merges"] = tok["model"]["merges"][: keep - 256]
    for j, a in enumerate(added):
        a["id"] = keep + j
    (out_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, separators=(",", ":")))


# ----------------------------------------------------------------------------- references


def prompt_ids(fixture: Fixture) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(fixture.seed + 7)
    vocab = kTrunk["vocab_size"]
    return (torch.randint(1, vocab, (kPromptLen,), generator=gen),
            torch.randint(1, vocab, (kPrompt2Len,), generator=gen))


def greedy_with_cache(model, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kNewTokens greedy tokens: the first from the cached prefill, then one single-token step each
    (transformers' recurrent KDA step and cached DSA)."""
    out = model(input_ids=prompt[None], use_cache=True)
    cache, step_logits = out.past_key_values, out.logits[0, -1]
    ids, logits = [], []
    while True:
        token = int(step_logits.argmax())
        ids.append(token)
        logits.append(step_logits.clone())
        if len(ids) == kNewTokens:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache, step_logits = out.past_key_values, out.logits[0, -1]
    return torch.tensor(ids, dtype=torch.int32), torch.stack(logits)


def compute_references(fixture: Fixture, model) -> dict[str, torch.Tensor]:
    prompt, prompt2 = prompt_ids(fixture)
    with torch.no_grad():
        refs = {
            "prompt_ids": prompt.to(torch.int32),
            "prefill_logits": model(input_ids=prompt[None], use_cache=False).logits[0],
        }
        refs["greedy_ids"], refs["decode_logits"] = greedy_with_cache(model, prompt)
        refs["prompt2_ids"] = prompt2.to(torch.int32)
        refs["prompt2_logits"] = model(input_ids=prompt2[None], use_cache=False).logits[0]
        refs["layer_outputs"] = layer_outputs(model, prompt)
    return {k: v.contiguous().clone() for k, v in refs.items()}


def layer_outputs(model, prompt: torch.Tensor) -> torch.Tensor:
    """[L, S, D]: what a drafter tapping layer i (DFlash's target_layer_ids, "HF hidden_states[i + 1]") conditions
    on. transformers records each layer's hyper-connected streams [S, hc, D] unreduced; the serving ports that run
    DFlash drafters on this architecture (SGLang's glm5_next, vLLM's mHC notes) contract them by the plain mean of
    the streams, as the final norm's input is. The last entry is hidden_states[L], already the final-normed [S, D]."""
    hs = model(input_ids=prompt[None], use_cache=False, output_hidden_states=True).hidden_states
    return torch.stack([h[0].mean(dim=1) if h.dim() == 4 else h[0] for h in hs[1:]])


# ----------------------------------------------------------------------------- decision gaps


def indexer_scores(module, x: torch.Tensor, q_resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool scores [T, P] of a whole sequence re-derived from the facts in specs/glm5-next.md §3, with
    pools whose last token the query cannot see at −inf; and the complete pools' token indices [P, pool]."""
    t, d, pool = x.shape[0], module.head_dim, module.index_kpool
    q = (q_resid @ module.wq_b.weight.T).view(t, module.n_heads, d)
    k = module.k_norm(x @ module.wk.weight.T)
    gate = x @ module.index_kpool_compress_gate.T
    num_pools = t // pool
    members = torch.arange(num_pools * pool).view(num_pools, pool)
    probs = torch.softmax(gate[members] + module.index_kpool_compress_ape[None], dim=1)
    pool_keys = (probs * k[members]).sum(1)
    w = (x @ module.weights_proj.weight.T) * module.n_heads ** -0.5
    per_head = torch.relu(torch.einsum("shd,pd->shp", q, pool_keys) * d ** -0.5)
    scores = torch.einsum("sh,shp->sp", w, per_head)
    visible = members[:, -1][None, :] <= torch.arange(t)[:, None]
    return scores.masked_fill(~visible, float("-inf")), members


def selection(module, scores: torch.Tensor, members: torch.Tensor, s: int) -> set[int]:
    pool = module.index_kpool
    row = scores[s]
    k = min(module.index_topk // pool, int(torch.isfinite(row).sum()))
    chosen = set(members[row.topk(k).indices].flatten().tolist()) if k > 0 else set()
    tail = (s + 1) % pool
    if module.index_kpool_always_select_tail:
        chosen |= set(range(s + 1 - tail, s + 1))
    return chosen


def decision_gaps(model, sequences: list[torch.Tensor]) -> dict[str, float]:
    """Margins of the discrete choices (experts, DSA pools); the pooled selection re-derived from the
    spec must equal the indices transformers chose, so this also checks the facts the C++ side uses."""
    gaps = {"router_expert": float("inf"), "indexer": float("inf")}
    hooks = []

    def router_hook(module, args, _out):
        x = args[0].reshape(-1, module.hidden_dim).float()
        choice = torch.sigmoid(x @ module.weight.float().T) + module.e_score_correction_bias
        gaps["router_expert"] = min(gaps["router_expert"], topk_gap(choice, module.top_k))

    def indexer_hook(module, args, kwargs, out):
        x, q_resid = kwargs["hidden_states"][0], kwargs["q_resid"][0]
        scores, members = indexer_scores(module, x, q_resid)
        for s in range(x.shape[0]):
            theirs = {i for i in out[0, s].tolist() if i >= 0}
            if selection(module, scores, members, s) != theirs:
                raise AssertionError(f"pooled selection re-derivation disagrees with transformers at query {s}")
        gaps["indexer"] = min(gaps["indexer"], topk_gap(scores, module.index_topk // module.index_kpool))

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


def check_margins(fixture: Fixture, model, refs: dict[str, torch.Tensor]) -> dict[str, float]:
    full = torch.cat([refs["prompt_ids"], refs["greedy_ids"][:-1]]).long()
    gaps = decision_gaps(model, [full, refs["prompt2_ids"].long()])
    top2 = refs["decode_logits"].topk(2, dim=-1).values
    gaps["greedy"] = float((top2[:, 0] - top2[:, 1]).min())
    limits = {"router_expert": kMinRouterGap, "indexer": kMinIndexerGap, "greedy": kMinGreedyGap}
    for key, limit in limits.items():
        if gaps[key] < limit:
            raise AssertionError(f"{fixture.name}: {key} decision gap {gaps[key]:.3g} < {limit:g}; pick another seed")
    return gaps


# ----------------------------------------------------------------------------- driver


def reference_metadata(fixture: Fixture) -> dict[str, str]:
    info = {
        "generator": "tools/make_reference_glm5_next.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": fixture.seed,
        "weights_dtype": "float32",
        "tensor_names": fixture.names,
    }
    return {"info": json.dumps(info, sort_keys=True)}


def saved_and_reloaded(model) -> torch.nn.Module:
    """The model as transformers' users get it: saved and loaded back with from_pretrained."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return load_eager_fp32(Path(tmp))


def check_written(fixture: Fixture, built, path: Path, refs: dict[str, torch.Tensor]) -> None:
    """The checkpoint as written holds the model: it loads back into transformers with the reference's prefill
    logits, or (flat original names, which transformers does not read) holds every tensor renamed bit for bit."""
    if fixture.names == "flat_original":
        check_flat_names(built, path)
        return
    with torch.no_grad():
        again = load_eager_fp32(path)(input_ids=refs["prompt_ids"].long()[None], use_cache=False).logits[0]
    if not torch.equal(again, refs["prefill_logits"]):
        raise AssertionError(f"{fixture.name}: the written checkpoint reloads to different logits")


def generate(fixture: Fixture) -> None:
    path = kFixtureRoot / fixture.name
    built = build_model(fixture)
    model = saved_and_reloaded(built)
    refs = compute_references(fixture, model)
    gaps = check_margins(fixture, model, refs)
    write_checkpoint(fixture, built, path)
    if fixture.tokenizer:
        write_tokenizer(path)
    check_written(fixture, built, path, refs)
    save_file(refs, str(path / "reference.safetensors"), metadata=reference_metadata(fixture))
    sizes = ", ".join(f"{f.name} {f.stat().st_size / 1e6:.2f} MB" for f in sorted(path.iterdir()))
    print(f"{fixture.name}: wrote {path.relative_to(kRepoRoot)} ({sizes}); "
          + ", ".join(f"min {k} gap {v:.3g}" for k, v in gaps.items()))


def check(fixture: Fixture) -> bool:
    """Recompute the references as generate() does and compare them: token ids exactly, values within 1e-5 of each
    tensor's largest (another CPU's BLAS sums in another order: ~3e-6 measured); check the written checkpoint too."""
    path = kFixtureRoot / fixture.name
    saved = load_file(str(path / "reference.safetensors"))
    built = build_model(fixture)
    fresh = compute_references(fixture, saved_and_reloaded(built))
    ok = saved.keys() == fresh.keys()
    for key in sorted(saved.keys() & fresh.keys()):
        a, b = saved[key], fresh[key]
        if a.shape != b.shape:
            same = False
        elif a.is_floating_point():
            same = bool((a - b).abs().max() <= 1e-5 * a.abs().max())
        else:
            same = torch.equal(a, b)
        if not same:
            print(f"{fixture.name}: {key} differs")
            ok = False
    try:
        check_written(fixture, built, path, fresh)
    except AssertionError as e:
        print(f"{fixture.name}: {e}")
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
