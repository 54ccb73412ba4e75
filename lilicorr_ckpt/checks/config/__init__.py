"""Config rules (LC0xx: schema and architecture; LC1xx: geometry keys), one module per concern, each rule's
catalogue row beside the check that emits it.

The checks run in the order registered here (the order of a report's config findings)."""

from lilicorr_ckpt.checks.config import (
    architecture,
    backbone,
    block,
    conv,
    head_geometry,
    mask,
    schema,
    siblings,
    taps,
    types,
)
from lilicorr_ckpt.checks.context import check

for _check in (
    schema.config_schema,
    types.config_class,
    architecture.architecture,
    head_geometry.lilicorr_geometry,
    block.block_size,
    taps.target_layer_ids,
    mask.mask_token,
    conv.conv_geometry,
    backbone.backbone_config,
    backbone.speculator_keys,
    siblings.sibling_config,
):
    check(_check)
