"""Hugging Face Hub ids as weights: `timm/NAME`, `hf-hub:ORG/NAME[@REVISION]` (timm's
`create_model` prefix), plain ids (`google/vit-base-patch16-224`) and `local-dir:PATH`, read
from the local Hugging Face cache as timm and transformers read it offline.

Nothing is downloaded here: an id resolves to its snapshot folder in the cache
(`huggingface_hub.snapshot_download(..., local_files_only=True)`, at the cache `HF_HUB_CACHE`
or `HF_HOME` name when it is called), which the folder readers then read as any timm or Hugging
Face folder; an id not in the cache is one line with the `hf download` command that fetches
it. A path that exists is always a path: `runs/x` is a run folder before it is an id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePath

from .checkpoint import CheckpointError

HUB_PREFIX, LOCAL_PREFIX = "hf-hub:", "local-dir:"

# A Hub repo id (ORG/NAME, letters, digits, '-', '_', '.'), with an optional @revision.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_](@[\w./-]+)?$")
# The suffixes of the weights files vitkit reads (a Hub id's '.tag' is none of them).
WEIGHTS_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
# What names a file, not a repo: a weights suffix, an exported model or a config.
_FILE_SUFFIXES = (*WEIGHTS_SUFFIXES, ".onnx", ".json")


def resolve_weights(source: str | os.PathLike) -> Path:
    """The file or folder `source` names: a path that exists as it is; `local-dir:PATH`, its
    path; a Hub id, its snapshot folder in the local Hugging Face cache (a CheckpointError
    with the command that fetches it when it is not there). Anything else comes back as the
    path it spells (whose absence its reader reports)."""
    path = Path(source)
    text = os.fspath(source)
    if path.exists() or not isinstance(text, str):
        return path
    if text.startswith(LOCAL_PREFIX):
        if not text.removeprefix(LOCAL_PREFIX).strip():
            raise CheckpointError(f"{LOCAL_PREFIX} names no folder; give {LOCAL_PREFIX}PATH")
        return Path(text.removeprefix(LOCAL_PREFIX)).expanduser()
    repo = text.removeprefix(HUB_PREFIX)
    named = text != repo or repo.startswith("timm/")
    if named and not _valid_id(repo):
        form, prefix = ("timm/NAME", "") if text == repo else (f"{HUB_PREFIX}ORG/NAME", HUB_PREFIX)
        raise CheckpointError(
            f"{text!r} is not a Hub id: give {form} (letters, digits, '-', '_' and '.', no "
            f"'..' or '--'), e.g. {prefix}timm/vit_base_patch16_224.augreg_in21k"
        )
    if not _valid_id(repo) or (text == repo and repo.endswith(_FILE_SUFFIXES)):
        return path
    return cached_snapshot(repo, named=named)


def _valid_id(repo: str) -> bool:
    """Whether `repo` is spelled as the Hub allows a repo id (huggingface_hub's
    `validate_repo_id`: no '..' or '--' either)."""
    name = repo.partition("@")[0]
    return bool(_REPO_ID.match(repo)) and ".." not in name and "--" not in name


def cached_snapshot(repo: str, *, named: bool = True) -> Path:
    """The snapshot folder of `repo` (`ORG/NAME[@REVISION]`) in the local cache. `named`:
    the id was given as one (`hf-hub:`, `timm/`), not a path that might have been meant."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{repo} is a Hugging Face Hub id, and reading one needs huggingface_hub: "
            "pip install 'vitkit[interop]'"
        ) from None
    repo_id, _, revision = repo.partition("@")
    cache = hub_cache()
    blocked = next((f for f in (cache, *cache.parents) if f.exists()), None)
    if blocked is not None and not blocked.is_dir():
        raise CheckpointError(
            f"the Hugging Face cache {cache} ({cache_setting()}) cannot be a folder: {blocked} "
            "is a file; point HF_HOME (or HF_HUB_CACHE) at a folder, or unset it"
        )
    try:
        folder = snapshot_download(
            repo_id, revision=revision or None, cache_dir=cache, local_files_only=True
        )
    except (FileNotFoundError, ValueError):  # LocalEntryNotFoundError is both
        what = f"{repo} is" if named else f"{repo} is no file or folder, and"
        raise CheckpointError(
            f"{what} not in the Hugging Face cache ({cache_setting()}); get it with: "
            f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
        ) from None
    return Path(folder)


def hub_cache() -> Path:
    """The Hugging Face cache as huggingface_hub finds it, read from the environment now (its
    own constants are read once, at its import): `HF_HUB_CACHE`, else `HF_HOME`/hub, else
    `XDG_CACHE_HOME`/huggingface/hub, else ~/.cache/huggingface/hub."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    return _hf_home() / "hub"


def cache_setting() -> str:
    """How the cache was chosen, for messages: `HF_HUB_CACHE=...` or `HF_HOME=...`."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return f"HF_HUB_CACHE={cache}" if cache else f"HF_HOME={_hf_home()}"


def _hf_home() -> Path:
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface"


def source_name(source: str | os.PathLike) -> str:
    """A short name for weights, safe in a URL: a file's name without its suffix, a run's
    folder name for its `model.safetensors`, a Hub id's name with its tag
    ('vit_small_patch16_224.augreg_in1k'); 'model' when nothing is left."""
    path = PurePath(os.fspath(source))
    if path.name == "model.safetensors" and path.parent.name:
        path = path.parent
    name = path.stem if path.suffix.lower() in (*WEIGHTS_SUFFIXES, ".onnx") else path.name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "model"
