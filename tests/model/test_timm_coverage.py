"""No timm ViT name is left unmentioned: every name of timm's `vision_transformer`,
`vision_transformer_hybrid`, `deit` and `vitamin` modules is a vitkit name (with timm's
architecture, tested family by family) or refused by name, in one line, with the reason."""

from __future__ import annotations

import pytest

import vitkit
from _helpers import optional_import, requires_timm
from vitkit.model.vit.presets import UNSUPPORTED_NAMES

timm = optional_import("timm")

MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit", "vitamin")


@requires_timm
def test_every_timm_vit_name_is_built_or_refused_by_name():
    modules = timm.models._registry._model_to_module
    names = [n for n in timm.list_models() if modules[n].rsplit(".", 1)[-1] in MODULES]
    ours = set(vitkit.list_models())
    unmentioned = [n for n in names if n not in ours and n not in UNSUPPORTED_NAMES]
    assert not unmentioned
    assert len(names) == 206 and sum(n in ours for n in names) == 201  # timm 1.0.31
    for name in UNSUPPORTED_NAMES:
        assert name in names and name not in ours
        with pytest.raises(ValueError, match=rf"^timm's {name} uses .+, which vitkit does not "):
            vitkit.create_model(name)
