"""The BEiT family's weights (timm's `beit.py`: BEiT, BEiT v2): timm's state dicts, files and Hub
folders and the original BEiT layout timm reads (`timm.py`), Hugging Face's `Beit*` and
`Data2VecVision*` models (`hf.py`), fitted to the model they go into as timm's
`checkpoint_filter_fn` fits them (`pretrained.py`), written as folders (`folders.py`), and what
the weights registry asks of them (`reading.py`). Registered in `weights/families.py`; nothing
outside it imports this room.
"""
