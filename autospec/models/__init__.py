# the weight formats a pair runs at (models/weights.py), here so the CLI reads them without torch
FORMATS = ("float32", "bfloat16", "int4")
# the default: the target's own format — a GGUF pair's 4-bit blocks where it has them (SmolLM2),
# else float32, the checkpoint as stored (the reference pair; any Hugging Face model)
AUTO = "auto"
# a GGUF pair's own 4-bit blocks, kept beside its converted checkpoint at fetch (models/fetch.py)
BLOCKS_FILE = "int4-blocks.safetensors"
