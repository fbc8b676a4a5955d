"""The SAM ViT's weights (timm's `vision_transformer_sam.py`): timm's state dicts, files and Hub
folders, and Meta's original Segment Anything checkpoints, in (`timm.py`), fitted to the model
they go into (`pretrained.py`), other libraries' folders refused with the reason
(`folders.py`), and what the weights registry asks of them (`reading.py`). Registered in
`weights/families.py`; nothing outside it imports this room.
"""
