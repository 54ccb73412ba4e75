"""Reading a checkpoint: files, config, tensor headers, geometry, manifest, quantization metadata, names.
Nothing here judges what it reads (that is checks/), and nothing imports torch."""

from lilicorr_ckpt.checkpoint.load import Checkpoint, assemble, load_checkpoint
from lilicorr_ckpt.checkpoint.target import TargetSpec, resolve_target_spec

__all__ = ["Checkpoint", "TargetSpec", "assemble", "load_checkpoint", "resolve_target_spec"]
