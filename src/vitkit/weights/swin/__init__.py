"""The Swin Transformer's weights (V1, V2 and timm's V2-cr): from timm and the original
Microsoft layout (`timm.py`), Hugging Face (`hf.py`; its backbone folders `hf_backbone.py`)
and torchvision (`torchvision.py`), out to Hugging Face and timm folders (`folders.py`), its
parity checks (`parity.py`), and what the weights registry asks of it (`reading.py`).
Registered in `weights/families.py`; nothing outside it imports this room.
"""
