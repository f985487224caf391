"""A minimal GPU workload for a profiler (``ncu``): the gather kernel at batch 64, N = 273,
on NCHW and channels-last pyramids, then the fused ``gather_tokens`` (fp32, bf16)
(``python -m fovea_book.bench gather_probe``). Writes no record; without a CUDA GPU it exits
1 at once."""

from __future__ import annotations

import torch

from fovea_book import kernels as K
from fovea_book.bench.common import BenchError
from fovea_book.bench.sampling import v1_tokens


def main(argv: list[str] | None = None) -> int:
    if argv:
        raise BenchError(f"gather_probe takes no arguments, got {' '.join(argv)}")
    if (why := K.backend_status()["cuda"]) is not None:
        raise BenchError(f"gather_probe: no usable CUDA GPU here ({why})")
    x = torch.rand(64, 3, 1024, 1024, device="cuda")
    tokens = v1_tokens(64).to("cuda")
    for pyr in (K.device_pyramid(x), K.device_pyramid(x.contiguous(memory_format=torch.channels_last))):
        out = K.gather_patches(pyr, tokens)
        for _ in range(3):
            K.gather_patches(pyr, tokens, out=out)
    pyr4 = K.nhwc4_pyramid(x)                      # the fused kernel: fp32 and bf16 output
    for dtype in (torch.float32, torch.bfloat16):
        out4 = K.gather_tokens(pyr4, tokens, channels=3, dtype=dtype)
        for _ in range(3):
            K.gather_tokens(pyr4, tokens, channels=3, dtype=dtype, out=out4)
    torch.cuda.synchronize()
    print("probe done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
