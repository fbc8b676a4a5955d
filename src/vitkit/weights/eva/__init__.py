"""The EVA family's weights (timm's `eva.py`: EVA, EVA-02, RoPE-ViT, Perception Encoder,
DINOv3, Sapiens2): timm's state dicts, files and Hub folders in (`timm.py`; the original
layouts timm reads: `original.py`), fitted to the model they go into (`pretrained.py`), a DINOv3
backbone written as transformers' folder and other folders refused with the reason
(`folders.py`), and what the weights registry asks of them (`reading.py`). Registered in
`weights/families.py`; nothing outside it imports this room.
"""
