#!/usr/bin/env python3
"""A GGUF with random bf16 weights of a glm4_moe_lite / deepseek_v3 config's shapes, laid out as llama.cpp's converter
(convert_hf_to_gguf.py: Glm4MoeLiteModel / DeepseekV2Model) lays out GLM-4.7-Flash: architecture `deepseek2`.

For llama-bench beside `kiln bench decode` (tools/llama_peer.sh): the values do not change the work, only the shapes
do, so no checkpoint is needed. What the converter would write and this writes too:
  - metadata: block count, context/embedding/feed-forward lengths, heads (head_count_kv = 1: MLA runs as MQA over
    the latent), rms eps, rope base (+ YaRN keys when the config has them), expert count / used / groups / groups
    used, leading dense block count, q_lora / kv_lora ranks, key/value lengths of the latent (kv_lora + rope,
    kv_lora) and of the decompressed heads (key_length_mla = nope + rope, value_length_mla = v_head), expert and
    shared-expert counts and widths, routed scale, norm_topk_prob, rope dimension count, vocab size, file type bf16;
  - tensors: token_embd, output_norm, output (untied); per layer attn_norm, attn_q_a / attn_q_a_norm / attn_q_b
    (or attn_q without q_lora), attn_kv_a_mqa, attn_kv_a_norm, kv_b split as the converter splits it for the absorbed
    MLA (attn_k_b [heads, kv_lora, nope] and attn_v_b [heads, v_head, kv_lora]), attn_output, ffn_norm; dense
    ffn_gate/up/down in the first first_k_dense_replace layers, then ffn_gate_inp (F32) and exp_probs_b (F32),
    experts stacked as ffn_{gate,up,down}_exps, shared expert ffn_{gate,up,down}_shexp. Norms and 1-D tensors F32,
    the rest BF16 (the converter's --outtype bf16).
Deliberate differences:
  - expert_gating_func = sigmoid is written explicitly. The converter writes it only when config.json names a
    scoring function, which GLM-4.7-Flash's does not; llama.cpp then infers sigmoid from "47 or 48 layers and a
    154880 vocab" and falls back to softmax otherwise, so a cut-down layer count would silently route differently.
  - no next-n (MTP) layer (the converter's --no-mtp): llama-bench never runs it.
  - the tokenizer is a stand-in of the config's vocab size (llama-bench feeds random ids and decodes no text): the
    256 byte-level tokens, one merge, the config's eos / pad ids as control tokens (the first eos named
    <|endoftext|>, which llama.cpp knows as end of generation), the rest unused fillers;
    `tokenizer.ggml.pre` is what the converter detects for the real tokenizer (glm4, deepseek-v3).
Weights: N(0, std) (default 0.02) rounded to bf16, norms 1, seeded and identical for any --threads; generated in
chunks on a thread pool while the previous tensor is written, so memory stays at a few tensors.

  python3 tools/make_random_gguf.py --config configs/models/glm-4.7-flash/config.json --layers 12 --out glm12.gguf

Needs numpy and gguf-py (PYTHONPATH=<llama.cpp>/gguf-py, or `pip install gguf`).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_random_gguf: needs gguf-py: PYTHONPATH=<llama.cpp source>/gguf-py or `pip install gguf`")

T = gguf.MODEL_TENSOR
ARCH = gguf.MODEL_ARCH.DEEPSEEK2
CHUNK = 1 << 24  # elements per generated chunk (64 MiB of fp32)
PRE_TOKENIZER = {"glm4_moe_lite": "glm4", "deepseek_v3": "deepseek-v3", "deepseek_v2": "deepseek-llm"}


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first); GGUF stores it reversed, as ggml's ne
    bf16: bool  # else F32
    fill: str = "normal"  # normal | ones

    @property
    def count(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.count * (2 if self.bf16 else 4)


def tname(kind: T, bid: int | None = None, suffix: str = "weight") -> str:
    if kind not in gguf.MODEL_TENSORS[ARCH]:
        raise AssertionError(f"{gguf.TENSOR_NAMES[kind]} is not a deepseek2 tensor")
    base = gguf.TENSOR_NAMES[kind].format(bid=bid) if bid is not None else gguf.TENSOR_NAMES[kind]
    return f"{base}.{suffix}"


def load_config(path: str, layers: int | None) -> dict:
    with open(path) as f:
        c = json.load(f)
    if c.get("model_type") not in PRE_TOKENIZER:
        sys.exit(f"make_random_gguf: model_type {c.get('model_type')!r} is not one of {sorted(PRE_TOKENIZER)}")
    if layers is not None:
        if layers < 1:
            sys.exit("make_random_gguf: --layers must be at least 1")
        c["num_hidden_layers"] = layers
    return c


def dense_layers(c: dict) -> int:
    """Leading dense layers: first_k_dense_replace, or the count of leading "dense" in transformers 5's
    mlp_layer_types (which llama.cpp cannot express beyond a leading run)."""
    if "first_k_dense_replace" in c:
        return min(int(c["first_k_dense_replace"]), c["num_hidden_layers"])
    types = c.get("mlp_layer_types") or []
    n = 0
    while n < len(types) and n < c["num_hidden_layers"] and types[n] == "dense":
        n += 1
    if any(t == "dense" for t in types[n:c["num_hidden_layers"]]):
        sys.exit("make_random_gguf: dense layers after the first sparse one cannot be written for deepseek2")
    return n


def tensors(c: dict) -> list[Tensor]:
    h, v = c["hidden_size"], c["vocab_size"]
    heads, nope, rope, vhd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c.get("q_lora_rank"), c["kv_lora_rank"]
    experts, moe_ff = c["n_routed_experts"], c["moe_intermediate_size"]
    shared_ff = moe_ff * c.get("n_shared_experts", 0)
    out = [Tensor(tname(T.TOKEN_EMBD), (v, h), True)]
    for i in range(c["num_hidden_layers"]):
        out.append(Tensor(tname(T.ATTN_NORM, i), (h,), False, "ones"))
        if q_lora:
            out += [Tensor(tname(T.ATTN_Q_A, i), (q_lora, h), True),
                    Tensor(tname(T.ATTN_Q_A_NORM, i), (q_lora,), False, "ones"),
                    Tensor(tname(T.ATTN_Q_B, i), (heads * (nope + rope), q_lora), True)]
        else:
            out.append(Tensor(tname(T.ATTN_Q, i), (heads * (nope + rope), h), True))
        out += [Tensor(tname(T.ATTN_KV_A_MQA, i), (kv_lora + rope, h), True),
                Tensor(tname(T.ATTN_KV_A_NORM, i), (kv_lora,), False, "ones"),
                Tensor(tname(T.ATTN_K_B, i), (heads, kv_lora, nope), True),
                Tensor(tname(T.ATTN_V_B, i), (heads, vhd, kv_lora), True),
                Tensor(tname(T.ATTN_OUT, i), (h, heads * vhd), True),
                Tensor(tname(T.FFN_NORM, i), (h,), False, "ones")]
        if i < dense_layers(c):
            ff = c["intermediate_size"]
            out += [Tensor(tname(T.FFN_GATE, i), (ff, h), True), Tensor(tname(T.FFN_UP, i), (ff, h), True),
                    Tensor(tname(T.FFN_DOWN, i), (h, ff), True)]
            continue
        out += [Tensor(tname(T.FFN_GATE_INP, i), (experts, h), False),
                Tensor(tname(T.FFN_EXP_PROBS_B, i, "bias"), (experts,), False),
                Tensor(tname(T.FFN_GATE_EXP, i), (experts, moe_ff, h), True),
                Tensor(tname(T.FFN_UP_EXP, i), (experts, moe_ff, h), True),
                Tensor(tname(T.FFN_DOWN_EXP, i), (experts, h, moe_ff), True)]
        if shared_ff:
            out += [Tensor(tname(T.FFN_GATE_SHEXP, i), (shared_ff, h), True),
                    Tensor(tname(T.FFN_UP_SHEXP, i), (shared_ff, h), True),
                    Tensor(tname(T.FFN_DOWN_SHEXP, i), (h, shared_ff), True)]
    out += [Tensor(tname(T.OUTPUT_NORM), (h,), False, "ones")]
    if not c.get("tie_word_embeddings", False):
        out.append(Tensor(tname(T.OUTPUT), (v, h), True))
    return out


def rope_settings(c: dict) -> dict:
    """rope_theta and the scaling dict, from either the published form (rope_theta + rope_scaling) or
    transformers 5's rope_parameters."""
    params = dict(c.get("rope_parameters") or {})
    scaling = dict(c.get("rope_scaling") or {})
    merged = {**params, **scaling}
    merged.setdefault("rope_theta", c.get("rope_theta", params.get("rope_theta", 10000.0)))
    merged["rope_type"] = merged.get("rope_type", merged.get("type", "default"))
    return merged


def write_metadata(w: gguf.GGUFWriter, c: dict, name: str) -> None:
    kv_lora, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(1)  # MLA as MQA over the latent, as the converter writes it
    r = rope_settings(c)
    if r["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(r["factor"])
        w.add_rope_scaling_orig_ctx_len(r["original_max_position_embeddings"])
        if "beta_fast" in r:
            w.add_rope_scaling_yarn_beta_fast(r["beta_fast"])
        if "beta_slow" in r:
            w.add_rope_scaling_yarn_beta_slow(r["beta_slow"])
    elif r["rope_type"] not in ("default", None):
        sys.exit(f"make_random_gguf: rope type {r['rope_type']!r} is not handled")
    w.add_rope_freq_base(r["rope_theta"])
    w.add_layer_norm_rms_eps(c.get("rms_norm_eps", 1e-6))
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    if "n_group" in c:
        w.add_expert_group_count(c["n_group"])
    if "topk_group" in c:
        w.add_expert_group_used_count(c["topk_group"])
    scoring = c.get("scoring_func", "sigmoid")
    w.add_expert_gating_func({"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
                              "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[scoring])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_leading_dense_block_count(dense_layers(c))
    w.add_vocab_size(c["vocab_size"])
    if c.get("q_lora_rank"):
        w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(c["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c.get("n_shared_experts", 0))
    if "routed_scaling_factor" in c:
        w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    if r["rope_type"] == "yarn" and r.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * r["mscale_all_dim"])  # the converter's convention, undone at load


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map: the 256 single-character tokens every byte-level BPE vocabulary holds."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(w: gguf.GGUFWriter, c: dict) -> None:
    v = c["vocab_size"]
    eos = c.get("eos_token_id")
    eos_ids = [i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int) and 257 <= i < v]
    pad = c.get("pad_token_id")
    if not eos_ids:
        eos_ids = [v - 1]
    if not (isinstance(pad, int) and 257 <= pad < v):
        pad = eos_ids[0]
    if v < 258:
        sys.exit("make_random_gguf: the stand-in tokenizer needs vocab_size of at least 258")
    tokens = byte_level_alphabet() + ["ĠĠ"] + [f"[PAD{i}]" for i in range(257, v)]
    types = [gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.UNUSED] * (v - 257)
    for i in sorted(set(eos_ids + [pad])):
        tokens[i], types[i] = f"<|control_{i}|>", gguf.TokenType.CONTROL
    tokens[eos_ids[0]] = "<|endoftext|>"  # a text llama.cpp knows as end-of-generation (GLM's own eos)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE_TOKENIZER[c["model_type"]])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ Ġ"])
    w.add_bos_token_id(eos_ids[0])
    w.add_eos_token_id(eos_ids[0])
    w.add_pad_token_id(pad)
    w.add_add_bos_token(False)


def fill_chunk(t: Tensor, out: np.ndarray, start: int, seed: int, index: int, std: float) -> None:
    """Elements [start, start + len(out)) of tensor number `index`, from a generator keyed by (seed, tensor,
    chunk): the same bytes for any thread count."""
    if t.fill == "ones":
        out[:] = 0x3F80 if t.bf16 else 1.0  # 1.0 in bf16 is 0x3f80
        return
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index, start // CHUNK])))
    x = rng.standard_normal(len(out), dtype=np.float32)
    x *= std
    if not t.bf16:
        out[:] = x
        return
    u = x.view(np.uint32)
    u += 0x7FFF + ((u >> 16) & 1)  # round to nearest even (no NaN can occur here)
    out[:] = (u >> 16).astype(np.uint16)


def make(pool: cf.Executor, t: Tensor, seed: int, index: int, std: float) -> np.ndarray:
    data = np.empty(t.count, dtype=np.uint16 if t.bf16 else np.float32)
    jobs = [pool.submit(fill_chunk, t, data[s:s + CHUNK], s, seed, index, std) for s in range(0, t.count, CHUNK)]
    for j in jobs:
        j.result()
    return data.reshape(t.shape)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a HF config.json (glm4_moe_lite or deepseek_v3 shapes)")
    p.add_argument("--layers", type=int, help="num_hidden_layers to write (default: the config's)")
    p.add_argument("--out", required=True, help="the .gguf to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.02, help="standard deviation of the weights (norms are 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="generator threads")
    p.add_argument("--name", help="general.name (default: <config dir> random <N> layers)")
    a = p.parse_args(argv)
    c = load_config(a.config, a.layers)
    name = a.name or f"{os.path.basename(os.path.dirname(os.path.abspath(a.config)))} random {c['num_hidden_layers']} layers"
    ts = tensors(c)
    total = sum(t.nbytes for t in ts)
    t0 = time.perf_counter()

    w = gguf.GGUFWriter(a.out, gguf.MODEL_ARCH_NAMES[ARCH])
    write_metadata(w, c, name)
    write_tokenizer(w, c)
    for t in ts:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.uint16 if t.bf16 else np.float32), t.nbytes,
                          raw_dtype=gguf.GGMLQuantizationType.BF16 if t.bf16 else gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # One tensor is written while the next one is generated (chunks on the pool, the driver on its own thread).
    with cf.ThreadPoolExecutor(max(1, a.threads)) as pool, cf.ThreadPoolExecutor(1) as ahead:
        pending = ahead.submit(make, pool, ts[0], a.seed, 0, a.std)
        for i in range(len(ts)):
            data = pending.result()
            if i + 1 < len(ts):
                pending = ahead.submit(make, pool, ts[i + 1], a.seed, i + 1, a.std)
            w.write_tensor_data(data)
            del data
    w.close()
    seconds = time.perf_counter() - t0
    params = sum(t.count for t in ts)
    print(f"wrote {a.out}: deepseek2, {c['num_hidden_layers']} layers ({dense_layers(c)} dense), {len(ts)} tensors, "
          f"{params / 1e9:.3f} B params, {total / 2**30:.2f} GiB, in {seconds:.1f} s ({total / 2**30 / seconds:.2f} GiB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
