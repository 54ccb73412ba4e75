"""The target's tokenizer in engine mode, and the seam where a GGUF target's direct tokenizer reader plugs in.

Engine mode needs the target's tokenizer, chat template and eos ids only (the server decodes), without torch.
`smoke.tokenize.load_tokenizer` gives them for every target kind; for a .gguf file it goes through transformers'
GGUF converter (`gguf_file=`: gguf.GGUFReader over every metadata element, then a conversion to a fast tokenizer),
which is slow on a large vocabulary. lilicorr_runtime/target/gguf_direct.py builds the same tokenizer from one pass
over the header, but it imports torch, which engine mode must not.

The seam: `DIRECT_GGUF` (or tokenizer_for's `gguf_reader`), a callable taking the target as given on the command
line and returning its `TargetTokenizer` read directly, or None where the direct reader cannot map that file
exactly (then transformers' converter is used, as now). Once a torch-free direct reader exists, setting
DIRECT_GGUF to it is the whole change here; nothing else in engine mode loads a tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable

from lilicorr_ckpt.checkpoint import resolve_target_spec
from lilicorr_ckpt.smoke.tokenize import TargetTokenizer, load_tokenizer

# the target spec (a .gguf file, or a directory holding one) -> its tokenizer read directly, or None: not mapped
GGUFTokenizerReader = Callable[[str], "TargetTokenizer | None"]

DIRECT_GGUF: GGUFTokenizerReader | None = None  # none yet: transformers' converter reads GGUF tokenizers


def tokenizer_for(spec: str, *, gguf_reader: GGUFTokenizerReader | None = None) -> TargetTokenizer:
    """The target's tokenizer, eos ids and record: a GGUF's from the direct reader where there is one and it maps
    the file, else (and for every other kind of target) load_tokenizer's."""
    reader = gguf_reader if gguf_reader is not None else DIRECT_GGUF
    if reader is not None and resolve_target_spec(spec).kind == "gguf":
        direct = reader(spec)
        if direct is not None:
            return direct
    return load_tokenizer(spec)
