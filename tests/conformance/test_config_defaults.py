"""The config-class defaults validate assumes (checks/config/backbone.py CONFIG_CLASS_INTERMEDIATE) are the ones
the installed transformers classes give, which both engines' AutoConfig builds."""

from __future__ import annotations

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from lilicorr_ckpt.checks.config.backbone import CONFIG_CLASS_INTERMEDIATE


@pytest.mark.parametrize("model_type", sorted(CONFIG_CLASS_INTERMEDIATE))
def test_intermediate_size_default_is_the_config_classes(model_type: str) -> None:
    assert CONFIG_MAPPING[model_type]().intermediate_size == CONFIG_CLASS_INTERMEDIATE[model_type]
