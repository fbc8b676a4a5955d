"""Weights in and out: safe checkpoints, and converters for timm, Hugging Face, torchvision and
JAX / big_vision. Imports the model package only."""

from .checkpoint import CheckpointError, load, load_state_dict, save
from .pretrained import load_pretrained

__all__ = ["CheckpointError", "load", "load_pretrained", "load_state_dict", "save"]
