"""The ViT's weights: converters in from timm (`timm.py`, over the shared layout of
`layout.py`), Hugging Face (`hf.py`; DINOv2, CLIP, SigLIP in `hf_families.py`, VitDet in
`vitdet.py`), torchvision (`torchvision.py`) and JAX (`jax.py`), and out (`to_timm`, `to_hf`,
the Hub folders of `folders.py`); the fitting of weights to a model (`pretrained.py`), its
parity checks and references (`parity.py`, `reference.py`), and what the weights registry
asks of it (`reading.py`). Registered in `weights/families.py`; nothing outside it imports
this room.
"""
