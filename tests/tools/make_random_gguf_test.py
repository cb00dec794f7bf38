#!/usr/bin/env python3
"""tools/make_random_gguf.py against what llama.cpp's deepseek2 loader asks for (src/models/deepseek2.cpp,
load_arch_hparams / load_arch_tensors, restated here in ggml's ne order), on GLM-4.7-Flash's config scaled down
(hidden 256, 3 layers, 8 experts top-2, vocab 1024; MLA with q_lora, one shared expert, the first layer dense).
Also: the bytes do not depend on --threads, and the weights have the asked-for spread.

Exits 77 (ctest: skipped) when gguf-py is not importable; it is looked for on PYTHONPATH, then in the source the
peer script unpacks (.llama/work/llama.cpp/gguf-py, see tools/llama_peer.sh).
"""
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import gguf  # noqa: F401
except ImportError:
    local = os.path.join(REPO, ".llama", "work", "llama.cpp", "gguf-py")
    if not os.path.isdir(local):
        print("skipped: gguf-py is not importable (pip install gguf, or tools/llama_peer.sh unpacks it)")
        sys.exit(77)
    sys.path.insert(0, local)
    os.environ["PYTHONPATH"] = local + os.pathsep + os.environ.get("PYTHONPATH", "")
import gguf  # noqa: E402
import numpy as np  # noqa: E402

SCALED = {"hidden_size": 256, "num_hidden_layers": 3, "intermediate_size": 512, "moe_intermediate_size": 64,
          "n_routed_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
          "vocab_size": 1024, "eos_token_id": [1000, 1001], "pad_token_id": 1000, "max_position_embeddings": 4096}
failures = []


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def write(config: str, out: str, threads: int) -> None:
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_random_gguf.py"), "--config", config,
                    "--out", out, "--threads", str(threads)], check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    with open(os.path.join(REPO, "configs", "models", "glm-4.7-flash", "config.json")) as f:
        c = {**json.load(f), **SCALED}
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "config.json")
        with open(config, "w") as f:
            json.dump(c, f)
        a, b = os.path.join(tmp, "a.gguf"), os.path.join(tmp, "b.gguf")
        write(config, a, 1)
        write(config, b, 3)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            check(fa.read() == fb.read(), "the file depends on --threads")
        r = gguf.GGUFReader(a)

        def kv(key):
            field = r.fields.get(key)
            return None if field is None else field.contents()

        arch = "deepseek2"
        check(kv("general.architecture") == arch, "architecture")
        h, L, E = 256, 3, 8
        heads, nope, rope, vhd, qlr, kvlr = 4, 32, 16, 32, 64, 64
        expect = {
            f"{arch}.block_count": L, f"{arch}.context_length": 4096, f"{arch}.embedding_length": h,
            f"{arch}.feed_forward_length": 512, f"{arch}.attention.head_count": heads,
            f"{arch}.attention.head_count_kv": 1, f"{arch}.expert_count": E, f"{arch}.expert_used_count": 2,
            f"{arch}.expert_group_count": 1, f"{arch}.expert_group_used_count": 1,
            f"{arch}.expert_gating_func": 2,  # sigmoid: llama.cpp infers it only for 47/48 layers and a 154880 vocab
            f"{arch}.leading_dense_block_count": 1, f"{arch}.vocab_size": 1024,
            f"{arch}.attention.q_lora_rank": qlr, f"{arch}.attention.kv_lora_rank": kvlr,
            f"{arch}.attention.key_length": kvlr + rope, f"{arch}.attention.value_length": kvlr,
            f"{arch}.attention.key_length_mla": nope + rope, f"{arch}.attention.value_length_mla": vhd,
            f"{arch}.expert_feed_forward_length": 64, f"{arch}.expert_shared_count": 1,
            f"{arch}.expert_weights_norm": True, f"{arch}.rope.dimension_count": rope,
            "general.file_type": 32, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "glm4",
            "tokenizer.ggml.eos_token_id": 1000, "tokenizer.ggml.padding_token_id": 1000,
        }
        for key, want in expect.items():
            check(kv(key) == want, f"{key} = {kv(key)!r}, want {want!r}")
        for key, want in {f"{arch}.rope.freq_base": 1e6, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
                          f"{arch}.expert_weights_scale": 1.8}.items():
            check(kv(key) is not None and abs(kv(key) - want) <= 1e-6 * want, f"{key} = {kv(key)!r}, want {want}")
        check(len(kv("tokenizer.ggml.tokens") or []) == 1024, "token list length")
        check(len(kv("tokenizer.ggml.token_type") or []) == 1024, "token type list length")
        check(bool(kv("tokenizer.ggml.merges")), "merges present")

        # The loader's create_tensor shapes (ne: innermost first) for this config, no MTP layer.
        want = {"token_embd.weight": [h, 1024], "output_norm.weight": [h], "output.weight": [h, 1024]}
        for i in range(L):
            p = f"blk.{i}."
            want.update({p + "attn_norm.weight": [h], p + "attn_q_a_norm.weight": [qlr],
                         p + "attn_kv_a_norm.weight": [kvlr], p + "attn_q_a.weight": [h, qlr],
                         p + "attn_q_b.weight": [qlr, heads * (nope + rope)],
                         p + "attn_kv_a_mqa.weight": [h, kvlr + rope], p + "attn_k_b.weight": [nope, kvlr, heads],
                         p + "attn_v_b.weight": [kvlr, vhd, heads], p + "attn_output.weight": [heads * vhd, h],
                         p + "ffn_norm.weight": [h]})
            if i == 0:
                want.update({p + "ffn_gate.weight": [h, 512], p + "ffn_down.weight": [512, h],
                             p + "ffn_up.weight": [h, 512]})
            else:
                want.update({p + "ffn_gate_inp.weight": [h, E], p + "exp_probs_b.bias": [E],
                             p + "ffn_down_exps.weight": [64, h, E], p + "ffn_gate_exps.weight": [h, 64, E],
                             p + "ffn_up_exps.weight": [h, 64, E], p + "ffn_gate_shexp.weight": [h, 64],
                             p + "ffn_down_shexp.weight": [64, h], p + "ffn_up_shexp.weight": [h, 64]})
        got = {t.name: t for t in r.tensors}
        check(set(got) == set(want), f"tensor names: missing {sorted(set(want) - set(got))}, "
                                     f"extra {sorted(set(got) - set(want))}")
        f32 = ("norm.weight", "exp_probs_b.bias", "ffn_gate_inp.weight")
        for name, t in got.items():
            check([int(n) for n in t.shape] == want.get(name), f"{name}: ne {list(t.shape)}, want {want.get(name)}")
            kind = gguf.GGMLQuantizationType.F32 if name.endswith(f32) else gguf.GGMLQuantizationType.BF16
            check(t.tensor_type == kind, f"{name}: {t.tensor_type.name}, want {kind.name}")
        emb = got["token_embd.weight"].data.view(np.uint16).astype(np.uint32) << 16
        std = float(emb.view(np.float32).std())
        check(0.019 < std < 0.021, f"token_embd std {std}, want 0.02")
        check(bool(np.all(got["blk.0.attn_norm.weight"].data == 1.0)), "norms are 1")
    for f in failures:
        print("FAIL:", f)
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
