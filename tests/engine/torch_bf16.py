"""PyTorch reference for the float32 -> bfloat16/float16 conversions (run with /usr/bin/python3).

Usage: torch_bf16.py OUT.safetensors. Writes, by hand (JSON header + raw little-endian bytes),
a safetensors file holding "x" (float32 inputs: random bit patterns, rounding ties, edge values),
"bf16" and "f16" (torch's x.to(bfloat16/float16)) and "bf16_f32"/"f16_f32" (torch's own .float()
of those). test_torch_bf16.c compares the C reader and writer against them bit for bit.
Exits 77 when torch cannot be imported (the test is then skipped).
"""

import json
import struct
import sys

try:
    import torch
except Exception as ex:  # noqa: BLE001 - any import failure means "skip"
    print(f"torch_bf16.py: cannot import torch ({ex}); skipping", file=sys.stderr)
    sys.exit(77)

EDGE_BITS = [
    0x00000000, 0x80000000, 0x3F800000, 0xBF800000,
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000,  # bf16 ties and neighbours
    0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000,
    0x7F7E8000,
    0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x00008001, 0x007FFFFF, 0x00800000,
    0x00400000, 0x80010000,
    0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF,  # NaNs
    0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0xC77FF000,  # f16: 65504, up to the inf tie
    0x33800000, 0x33000000, 0x33000001, 0x33C00000, 0x387FC000, 0x38800000,  # f16 subnormals
    0x38801000, 0x38803000, 0x3F801000, 0x3F803000,  # f16 ties
]


def to_f32(bits64):
    """int64 tensor of u32 bit patterns -> float32 tensor with those bits."""
    signed = bits64 - (bits64 >= 2**31).to(torch.int64) * 2**32
    return signed.to(torch.int32).view(torch.float32)


def main():
    out = sys.argv[1]
    g = torch.Generator().manual_seed(20240607)
    n = 1 << 16
    parts = [
        to_f32(torch.tensor(EDGE_BITS, dtype=torch.int64)),
        to_f32(torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)),  # any bits
        # bf16 ties: low half exactly 0x8000
        to_f32((torch.randint(0, 2**16, (n,), generator=g, dtype=torch.int64) << 16) | 0x8000),
        # f16 ties in the normal range: low 13 bits 0x1000
        to_f32((torch.randint(0x33000, 0x47800, (n,), generator=g, dtype=torch.int64) << 13)
               | 0x1000),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g) * 1e-6,  # f16 subnormals
        torch.randn(n, generator=g) * 3e4,  # near the f16 limit
        torch.randn(n, generator=g) * 1e-39,  # f32 subnormals
    ]
    x = torch.cat(parts).contiguous()
    bf16 = x.to(torch.bfloat16)
    f16 = x.to(torch.float16)
    tensors = [
        ("x", "F32", x.view(torch.int32).numpy().astype("<i4").tobytes()),
        ("bf16", "BF16", bf16.view(torch.int16).numpy().astype("<i2").tobytes()),
        ("f16", "F16", f16.view(torch.int16).numpy().astype("<i2").tobytes()),
        ("bf16_f32", "F32", bf16.float().view(torch.int32).numpy().astype("<i4").tobytes()),
        ("f16_f32", "F32", f16.float().view(torch.int32).numpy().astype("<i4").tobytes()),
    ]
    header, off = {"__metadata__": {"torch": torch.__version__}}, 0
    for name, dtype, data in tensors:
        header[name] = {"dtype": dtype, "shape": [x.numel()], "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data)


if __name__ == "__main__":
    main()
