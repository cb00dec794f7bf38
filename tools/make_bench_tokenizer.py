#!/usr/bin/env python3
"""Writes a tokenizer.json for a dummy-weight model directory (model.load = "dummy"), so `kiln serve` can run its
recipe and `kiln bench serve` can drive it: the trained tiny model's byte-level BPE (models/tiny-glm, ids < 4,060),
filler tokens `<tN>` up to the model's vocabulary, and the GLM special tokens moved to where the model's config puts
them (its eos_token_id list names <|endoftext|>, <|user|> and <|observation|>; the tiny tokenizer keeps GLM's order
of special tokens, so all of them move by one offset; a config naming image and video token ids — a model with a
vision tower — is checked to get them exactly). Prompts then use real ids below 4,060 and every id the random
model generates decodes to text. For timing only: the text means nothing.

    python3 tools/make_bench_tokenizer.py MODEL_DIR        (writes MODEL_DIR/tokenizer.json)
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MEDIA_TOKENS = {"image_start_token_id": "<|begin_of_image|>", "image_token_id": "<|image|>",
                "image_end_token_id": "<|end_of_image|>", "video_start_token_id": "<|begin_of_video|>",
                "video_token_id": "<|video|>", "video_end_token_id": "<|end_of_video|>"}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    model_dir = pathlib.Path(sys.argv[1])
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
    eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id")
    first_special = min(eos) if isinstance(eos, list) else int(eos)

    tok = json.loads((ROOT / "models/tiny-glm/tokenizer.json").read_text())
    specials = sorted(tok["added_tokens"], key=lambda t: t["id"])
    tiny_first = specials[0]["id"]
    if specials[0]["content"] != "<|endoftext|>":
        raise SystemExit("models/tiny-glm/tokenizer.json: expected <|endoftext|> as its first special token")
    offset = first_special - tiny_first
    if offset < 0 or first_special + len(specials) > vocab_size:
        raise SystemExit(f"{model_dir}/config.json: special tokens from id {first_special} do not fit vocab {vocab_size}")
    for t in specials:
        t["id"] += offset
    # A model with a vision tower names its image (and video) tokens at the top level of config.json: the chat
    # template's image parts become <|begin_of_image|>, <|image|> × n, <|end_of_image|> with those ids, so the moved
    # special tokens must land exactly there (GLM's order puts them at 154830, 154854, 154831 from 154820).
    by_content = {t["content"]: t["id"] for t in specials}
    for key, content in MEDIA_TOKENS.items():
        if key in config and by_content.get(content) != config[key]:
            raise SystemExit(f"{model_dir}/config.json: {key} is {config[key]}, but {content} moves to "
                             f"{by_content.get(content)}")
    # Ids must stay contiguous for Hugging Face tokenizers: the BPE vocabulary holds 0 .. first_special − 1 (fillers
    # after the tiny model's own entries), the special tokens follow, and fillers past them are added tokens too.
    vocab = tok["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in specials}

    def filler(i: int) -> str:
        name = f"<t{i}>"
        if name in taken:
            raise SystemExit(f"filler token {name} collides with the tiny vocabulary")
        return name

    for i in range(tiny_first, first_special):
        vocab[filler(i)] = i
    for i in range(first_special + len(specials), vocab_size):
        specials.append({"id": i, "content": filler(i), "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": False})
    tok["added_tokens"] = specials
    out = model_dir / "tokenizer.json"
    out.write_text(json.dumps(tok, ensure_ascii=False))
    print(f"{out}: {len(vocab)} BPE entries, then {len(specials)} added tokens from id {first_special} "
          f"(vocab {vocab_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
