#!/usr/bin/env python3
"""make_tiny_qwen3next.py — a seeded random-weight file in llama.cpp's `qwen3next` layout
(Qwen3-Next-80B-A3B's tensors and keys, scaled down): make_tiny_qwen35moe.py --arch qwen3next,
whose docstring states the shapes and what sets the two layouts apart.

    make_tiny_qwen3next.py OUT.gguf [--seed 0] [--no-mtp] [--interval N] [--q8] [--legacy-ssm-in]
                           [--omit-key SUFFIX] [--omit-tensor NAME] [--shape K=V,...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_qwen35moe  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    make_tiny_qwen35moe.main(["--arch", "qwen3next", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
