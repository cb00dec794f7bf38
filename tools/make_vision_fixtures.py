#!/usr/bin/env python3
"""Fixtures for plugins/vision: images decoded and processed by transformers 5.17's glm5_next image processor.

    python3 tools/make_vision_fixtures.py            # (re)generate plugins/vision/tests/data
    python3 tools/make_vision_fixtures.py --check    # regenerate in memory, require the committed files unchanged

The reference is what transformers does by default: AutoImageProcessor picks the torchvision backend
(Glm5NextImageProcessor) when torchvision is installed, and an image given as a data URL is decoded by
torchvision.io.decode_image(mode=RGB) (no EXIF orientation). 16-bit PNGs are the exception: torchvision hands the
processor a uint16 tensor (a range the processor does not expect), so their reference is the PIL route
(processor(images=PIL image) → convert("RGB"): the high byte of 16-bit RGB, 16-bit gray clipped to 255).

Images are generated deterministically (numpy, fixed seeds) and kept small. Full pixel_values would be megabytes,
so each image's expectation is (images.json):
  - the decoded RGB8 pixels and the uint8 canvas (resized content + zero padding, the processor's resize output)
    as checksums, with shapes;
  - pixel_values: shape, float64 sum, and sampled values (float32 bit patterns) at fixed indices;
  - image_grid_thw.
The script checks that normalising + patchifying its canvas reproduces the processor's pixel_values bit for bit,
so an exact canvas and exact samples pin pixel_values.
resize.json: the antialiased bicubic uint8 resize alone (torchvision's call in TorchvisionBackend.resize) on
synthetic inputs a formula defines, over many size pairs (up, down, one axis, extreme ratios), as checksums.
canvas.json: canvas and content sizes for many image sizes (both budget branches, 1-pixel sides).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL.Image
import torch
import transformers
from torchvision.transforms.v2 import functional as tvF
from transformers.image_utils import PILImageResampling
from transformers.models.glm5_next.image_processing_glm5_next import Glm5NextImageProcessor

DATA = Path(__file__).resolve().parent.parent / "plugins/vision/tests/data"
MASK64 = (1 << 64) - 1


def checksum(array: np.ndarray) -> str:
    """Σ b[i]·(1 + (i·2654435761 mod 2^32)) mod 2^64 over the bytes (HWC order), as hex; the tests compute the same."""
    b = np.ascontiguousarray(array, dtype=np.uint8).reshape(-1).astype(np.uint64)
    i = np.arange(b.size, dtype=np.uint64)
    w = (i * np.uint64(2654435761)) % np.uint64(1 << 32) + np.uint64(1)
    with np.errstate(over="ignore"):
        return f"{int(np.sum(b * w, dtype=np.uint64)) & MASK64:016x}"


def synthetic(h: int, w: int, seed: int) -> np.ndarray:
    """The formula the C++ test evaluates too: a hash of (y, x, c, seed), mixed with a smooth ramp."""
    y, x, c = np.meshgrid(np.arange(h, dtype=np.uint32), np.arange(w, dtype=np.uint32), np.arange(3, dtype=np.uint32),
                          indexing="ij")
    with np.errstate(over="ignore"):
        v = (y * np.uint32(73856093)) ^ (x * np.uint32(19349663)) ^ (c * np.uint32(83492791)) ^ np.uint32(seed * 2654435761 & 0xFFFFFFFF)
        v = v * np.uint32(0x9E3779B1)
        v ^= v >> np.uint32(15)
    noise = (v & np.uint32(255)).astype(np.uint8)
    ramp = ((x * np.uint32(255)) // np.uint32(max(w - 1, 1))).astype(np.uint8)
    # Left half noise (clamping, ringing), right half a ramp (smooth interpolation).
    return np.where(x < w // 2, noise, ramp).astype(np.uint8)


def scene(h: int, w: int, seed: int, noise: float = 4.0) -> np.ndarray:
    """A photo-like RGB image: smooth gradients, a few sharp rectangles and mild noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([
        128 + 100 * np.sin(xx / max(w, 1) * 6.28 + seed),
        128 + 100 * np.cos(yy / max(h, 1) * 3.14 * 2),
        255 * (xx + yy) / max(h + w, 1),
    ], axis=-1)
    for _ in range(6):
        y0, x0 = rng.integers(0, max(h - 1, 1)), rng.integers(0, max(w - 1, 1))
        y1, x1 = y0 + rng.integers(1, max(h // 3, 2)), x0 + rng.integers(1, max(w // 3, 2))
        img[y0:y1, x0:x1] = rng.integers(0, 256, 3)
    img += rng.normal(0, noise, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png_bytes(w: int, h: int, color_type: int, bit_depth: int, rows: list[bytes], interlace: int = 0,
              extra: list[tuple[bytes, bytes]] = ()) -> bytes:
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, interlace))
    for t, d in extra:
        out += chunk(t, d)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def encode(img: PIL.Image.Image, fmt: str, **kw) -> bytes:
    bio = io.BytesIO()
    img.save(bio, fmt, **kw)
    return bio.getvalue()


def make_images() -> dict[str, tuple[bytes, str]]:
    """name → (file bytes, route): route 'data_url' (torchvision decode) or 'pil'."""
    rng = np.random.default_rng(18)
    images: dict[str, tuple[bytes, str]] = {}
    images["one_pixel.png"] = (encode(PIL.Image.fromarray(np.array([[[200, 30, 90]]], np.uint8)), "PNG"), "data_url")
    images["tiny_rgb.png"] = (encode(PIL.Image.fromarray(scene(9, 13, 1)), "PNG"), "data_url")
    rgba = np.concatenate([scene(40, 64, 2), rng.integers(0, 256, (40, 64, 1), dtype=np.uint8)], axis=-1)
    images["small_rgba.png"] = (encode(PIL.Image.fromarray(rgba, "RGBA"), "PNG"), "data_url")
    pal = PIL.Image.fromarray(scene(30, 50, 3)).quantize(colors=16)
    pal.info["transparency"] = 3
    images["palette_trns.png"] = (encode(pal, "PNG", transparency=3), "data_url")
    g16 = (np.add.outer(np.arange(37) * 9, np.arange(41) * 7) * 3).astype(">u2")
    images["gray16.png"] = (png_bytes(41, 37, 0, 16, [r.tobytes() for r in g16]), "pil")
    rgb16 = (scene(21, 35, 4).astype(np.uint16) * 257 + rng.integers(0, 256, (21, 35, 3))).astype(">u2")
    images["rgb16.png"] = (png_bytes(35, 21, 2, 16, [r.tobytes() for r in rgb16]), "pil")
    g2 = rng.integers(0, 4, (33, 65), dtype=np.uint8)
    passes = []  # Adam7: the scanlines of each pass's sub-image, one after another
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
        sub = g2[y0::dy, x0::dx]
        if sub.size:
            passes += [np.packbits(np.unpackbits(r[:, None], axis=1)[:, 6:].reshape(-1)).tobytes() for r in sub]
    images["gray2_interlaced.png"] = (png_bytes(65, 33, 0, 2, passes, interlace=1), "data_url")
    images["photo.jpg"] = (encode(PIL.Image.fromarray(scene(480, 640, 5)), "JPEG", quality=85), "data_url")
    images["gray_progressive.jpg"] = (
        encode(PIL.Image.fromarray(scene(300, 200, 6)[..., 1]), "JPEG", quality=80, progressive=True), "data_url")
    images["cmyk.jpg"] = (encode(PIL.Image.fromarray(rgba[:48, :64].copy(), "CMYK"), "JPEG", quality=90), "data_url")
    images["rgba_lossless.webp"] = (encode(PIL.Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True), "data_url")
    images["panorama.webp"] = (encode(PIL.Image.fromarray(scene(600, 16000, 7, noise=1.0)), "WEBP", quality=30), "data_url")
    images["huge.jpg"] = (encode(PIL.Image.fromarray(scene(2900, 2300, 8, noise=1.0)), "JPEG", quality=30), "data_url")
    images["tall_thin.png"] = (encode(PIL.Image.fromarray(scene(3000, 1, 9)), "PNG"), "data_url")
    # EXIF orientation 6 (rotate 90° on display): the reference's decode leaves the pixels as stored.
    exif = PIL.Image.Exif()
    exif[0x0112] = 6
    images["exif_rotated.jpg"] = (encode(PIL.Image.fromarray(scene(60, 90, 10)), "JPEG", quality=85, exif=exif),
                                  "data_url")
    return images


def decode(data: bytes, route: str) -> torch.Tensor:
    """The uint8 [3, H, W] tensor the processor resizes, by the route transformers takes."""
    if route == "pil":
        return torch.from_numpy(np.array(PIL.Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1).contiguous()
    from torchvision.io import ImageReadMode, decode_image
    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


def processor_input(data: bytes, name: str, route: str):
    if route == "pil":
        return PIL.Image.open(io.BytesIO(data))
    mime = {"png": "png", "jpg": "jpeg", "webp": "webp"}[name.rsplit(".", 1)[1]]
    return f"data:image/{mime};base64," + base64.b64encode(data).decode()


def canvas_of(processor: Glm5NextImageProcessor, image: torch.Tensor) -> torch.Tensor:
    return processor.resize(image[None], resample=PILImageResampling.BICUBIC, factor=28, temporal_factor=2,
                            min_image_tokens=16, max_image_tokens=8000)[0]


def f32_bits(v: float) -> str:
    return f"{struct.unpack('<I', struct.pack('<f', v))[0]:08x}"


def image_fixtures(processor: Glm5NextImageProcessor) -> tuple[dict, dict[str, bytes]]:
    images = make_images()
    mean255 = (torch.tensor(processor.image_mean) * (1.0 / processor.rescale_factor)).tolist()
    std255 = (torch.tensor(processor.image_std) * (1.0 / processor.rescale_factor)).tolist()
    entries = []
    for name, (data, route) in images.items():
        decoded = decode(data, route)
        assert decoded.dtype == torch.uint8, name
        if route == "data_url":  # PIL's convert("RGB") must agree wherever it is not the reference
            pil = decode(data, "pil")
            assert torch.equal(pil, decoded), f"{name}: torchvision and PIL decode differently"
        out = processor(images=[processor_input(data, name, route)], return_tensors="pt")
        pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
        canvas = canvas_of(processor, decoded)
        # normalise + patchify the canvas by hand: must be the processor's pixel_values exactly
        x = (canvas.float() - torch.tensor(mean255)[:, None, None]) / torch.tensor(std255)[:, None, None]
        gh, gw = canvas.shape[1] // 14, canvas.shape[2] // 14
        mine = x.reshape(3, gh // 2, 2, 14, gw // 2, 2, 14).permute(1, 4, 2, 5, 0, 3, 6)
        mine = mine.unsqueeze(5).expand(-1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, 1176)
        assert torch.equal(mine, pixel_values), f"{name}: canvas does not explain pixel_values"
        content = (canvas != 0).any(0)
        flat = pixel_values.reshape(-1)
        g = np.random.default_rng(len(entries))
        idx = sorted({0, flat.numel() - 1, *g.integers(0, flat.numel(), 62).tolist()})
        entries.append({
            "file": f"images/{name}", "route": route,
            "decoded": {"height": decoded.shape[1], "width": decoded.shape[2],
                        "checksum": checksum(decoded.permute(1, 2, 0).numpy())},
            "canvas": {"height": canvas.shape[1], "width": canvas.shape[2],
                       "checksum": checksum(canvas.permute(1, 2, 0).numpy())},
            "image_grid_thw": grid[0].tolist(),
            "pixel_values": {"shape": list(pixel_values.shape), "sum": float(pixel_values.double().sum()),
                             "samples": [[i, f32_bits(float(flat[i]))] for i in idx]},
        })
        print(f"{name}: {decoded.shape[2]}x{decoded.shape[1]} ({route}) -> canvas {canvas.shape[2]}x{canvas.shape[1]}"
              f" grid {grid[0].tolist()} patches {pixel_values.shape[0]} ({len(data)} bytes)")
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__,
                "processor": type(processor).__name__, "backend": processor.backend,
                "mean255_bits": [f32_bits(v) for v in mean255], "std255_bits": [f32_bits(v) for v in std255],
                "images": entries}
    return manifest, {f"images/{k}": v for k, (v, _) in images.items()}


def resize_fixtures() -> dict:
    rng = np.random.default_rng(7)
    pairs = [(1, 1, 5, 7), (5, 7, 1, 1), (1, 200, 3, 2), (200, 1, 2, 3), (64, 64, 64, 32), (64, 64, 32, 64),
             (64, 64, 65, 64), (30, 40, 300, 17), (500, 3, 7, 400), (97, 89, 13, 11), (13, 11, 97, 89)]
    while len(pairs) < 160:
        ih, iw = (int(v) for v in rng.integers(1, 260, 2))
        oh, ow = (int(v) for v in rng.integers(1, 260, 2))
        if rng.random() < 0.15:
            oh = ih
        pairs.append((ih, iw, oh, ow))
    cases = []
    for n, (ih, iw, oh, ow) in enumerate(pairs):
        src = torch.from_numpy(synthetic(ih, iw, n)).permute(2, 0, 1)[None]
        out = tvF.resize(src, [oh, ow], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)[0]
        cases.append({"seed": n, "in": [ih, iw], "out": [oh, ow], "input_checksum": checksum(synthetic(ih, iw, n)),
                      "checksum": checksum(out.permute(1, 2, 0).numpy())})
    return {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}


def canvas_fixtures(processor: Glm5NextImageProcessor) -> dict:
    rng = np.random.default_rng(9)
    sizes = [(1, 1), (1, 2), (2, 1), (10, 10), (111, 111), (112, 112), (113, 112), (28, 448), (1, 3000), (3000, 1),
             (2500, 2500), (2600, 2600), (2000, 4000), (700, 9000), (4000, 1000), (1, 20000), (3, 12000), (57, 61)]
    while len(sizes) < 80:
        h, w = (int(v) for v in np.exp(rng.uniform(0, np.log(5000), 2)))
        sizes.append((max(h, 1), max(w, 1)))
    cases = []
    for h, w in sizes:
        canvas = canvas_of(processor, torch.full((3, h, w), 255, dtype=torch.uint8))
        rows, cols = torch.nonzero(canvas[0], as_tuple=True)
        cases.append({"in": [h, w], "canvas": [canvas.shape[1], canvas.shape[2]],
                      "content": [int(rows.max()) + 1, int(cols.max()) + 1]})
    return {"transformers": transformers.__version__, "cases": cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    processor = Glm5NextImageProcessor()
    manifest, files = image_fixtures(processor)
    outputs = {"images.json": json.dumps(manifest, indent=1).encode() + b"\n",
               "resize.json": json.dumps(resize_fixtures(), indent=1).encode() + b"\n",
               "canvas.json": json.dumps(canvas_fixtures(processor), indent=1).encode() + b"\n", **files}
    failed = False
    for rel, data in outputs.items():
        path = DATA / rel
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                print(f"differs: {path}")
                failed = True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    print(f"{'checked' if args.check else 'wrote'} {len(outputs)} files, {sum(len(v) for v in outputs.values())} bytes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
