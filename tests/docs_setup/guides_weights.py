"""Files docs/guides/weights.md assumes, all from RANDOM weights (nothing is downloaded): a timm
ViT-Ti/16 state dict, a small Hugging Face ViT folder with its image processor and class
names, and a small checkpoint in the layout of the ViT paper's JAX `.npz` files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import safetensors.torch
import timm
import torch
import transformers

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


def write_jax_npz(model: VisionTransformer, path: Path) -> None:
    """A model's weights in the layout of google-research/vision_transformer (as
    tests/weights/test_jax.py writes them)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    dim, heads = model.embed_dim, model.config.num_heads
    hd = dim // heads
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
        "cls": sd["cls_token"],
    }
    for i in range(model.config.depth):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = p + "MultiHeadDotProductAttention_1/"
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3)
        qb, kb, vb = np.split(sd[b + "attn.qkv.bias"], 3)
        for name, w, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            out[f"{mha}{name}/kernel"] = w.T.reshape(dim, heads, hd)
            out[f"{mha}{name}/bias"] = bias.reshape(heads, hd)
        out[mha + "out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(heads, hd, dim)
        out[mha + "out/bias"] = sd[b + "attn.proj.bias"]
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            out[f"{p}{theirs}/scale"] = sd[f"{b}{ours}.weight"]
            out[f"{p}{theirs}/bias"] = sd[f"{b}{ours}.bias"]
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{p}MlpBlock_3/{theirs}/kernel"] = sd[f"{b}mlp.{ours}.weight"].T
            out[f"{p}MlpBlock_3/{theirs}/bias"] = sd[f"{b}mlp.{ours}.bias"]
    np.savez(path, **out)
