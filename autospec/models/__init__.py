# the weight formats a pair runs at (models/weights.py), here so the CLI reads them without torch
FORMATS = ("float32", "bfloat16", "int4")
# the default: the target's own format — a GGUF pair's 4-bit blocks where it has them (SmolLM2),
# else float32, the checkpoint as stored (the reference pair; any Hugging Face model)
AUTO = "auto"
# a GGUF pair's own 4-bit blocks and the GGUF itself, kept at fetch (models/fetch.py) in a folder
# of the converted checkpoint that no loader reads: vLLM loads every *.safetensors at its top
KEPT_DIR = "autospec"
BLOCKS_FILE = f"{KEPT_DIR}/int4-blocks.safetensors"


class ModelLoadError(ValueError):
    """A model path or model pair that cannot be used; the message names it (models/pair.py,
    models/pairs.py)."""
