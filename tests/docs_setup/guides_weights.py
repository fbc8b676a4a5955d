"""Files docs/guides/weights.md assumes, all from RANDOM weights (nothing is downloaded): a timm
ViT-Ti/16 state dict, a small Hugging Face ViT folder with its image processor and class
names, and a small checkpoint in the layout of the ViT paper's JAX `.npz` files."""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import timm
import torch
import transformers

from _helpers import write_jax_npz
from vitkit import VisionTransformer


def setup(folder: Path) -> None:
    torch.manual_seed(0)
    timm_model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    safetensors.torch.save_file(timm_model.state_dict(), folder / "vit_tiny.safetensors")

    names = ["cat", "dog", "fox"]
    config = transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=32,
        patch_size=8,
        num_labels=3,
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
    )
    transformers.ViTForImageClassification(config).save_pretrained(folder / "hf-vit")
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder / "hf-vit")

    jax_model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10
    )
    write_jax_npz(jax_model, folder / "ViT-tiny.npz")
