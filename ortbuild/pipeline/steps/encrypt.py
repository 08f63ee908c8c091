"""Step: encrypt every file of the artifact (the graph and its external data), streaming each from the private
temp dir into a partial file beside the published artifact: one chunk in memory at a time, hashed as written.
The package step renames the partial files into place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from ortbuild import files as files_
from ortbuild import modelfiles
from ortbuild.artifact import container, keys, manifest_types, pieces
from ortbuild.project.config import Settings


@dataclass(frozen=True)
class EncryptResult:
    files: tuple[tuple[manifest_types.ArtifactFile, Path], ...]  # each artifact file and its partial file in out_dir
    external: str            # why the artifact's weights are external data ("": they are not)
    deterministic: bool      # SOURCE_DATE_EPOCH asked for reproducible output

    @property
    def size(self) -> int:
        return sum(f.size for f, _ in self.files)

    @property
    def main(self) -> manifest_types.ArtifactFile:
        return next(f for f, _ in self.files if f.role == "model")

    def artifact_section(self, fmt: str, source_size: int) -> manifest_types.Artifact:
        return manifest_types.Artifact(file=self.main.name, format=fmt, sha256=self.main.sha256, size=self.size,
                                 size_ratio=round(self.size / source_size, 4), files=[f for f, _ in self.files],
                                 external_data=self.external)

    def encryption_section(self, key: keys.EncryptionKey | None) -> manifest_types.Encryption | None:
        if key is None:
            return None
        return manifest_types.Encryption(container="ortbuild-container-v1", algorithm="AES-256-GCM", key_id=key.key_id,
                                   chunk_size=1 << container.DEFAULT_CHUNK_LOG2, deterministic=self.deterministic,
                                   development_key=key.development)


def run(artifact: Path, settings: Settings, dist: Path, out_dir: Path, work: Path, external: str,
        key: keys.EncryptionKey | None, deterministic: bool) -> EncryptResult:
    main = settings.format_rule.file
    files = modelfiles.of(artifact, hashed=False)
    if external and not files.has_external_data:  # a compiled (EPContext) model: split its data off here
        folder = work / "external"
        folder.mkdir()
        model = onnx.load(str(artifact))
        onnx.save_model(model, str(folder / main), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{main}.data", size_threshold=1024)
        del model
        files = modelfiles.of(folder / main, hashed=False)
    files_.safe_mkdir(out_dir, dist)
    sealed = []
    for f in files.files:
        location = f.location or main
        name = f"{location}.enc" if settings.encrypt else location
        partial = files_.partial_file(out_dir / name, dist)
        with files_.open_partial(partial) as out:
            if settings.encrypt:
                if key is None:
                    raise RuntimeError("Builder.check_keys() lets no encrypting job start without a key")
                sha, size, digests = container.encrypt_file(f.path, out, key.secret, deterministic=deterministic)
            else:  # encrypt = false: the plaintext, copied and hashed in one pass
                h, size = pieces.Hasher(0, pieces.PLAIN_PIECE), 0
                with open(f.path, "rb") as src:
                    while piece := src.read(1 << 20):
                        h.update(piece)
                        out.write(piece)
                        size += len(piece)
                sha, digests = h.result()
            out.flush()
            os.fsync(out.fileno())
        entry = manifest_types.ArtifactFile(name=name, role="external_data" if f.location else "model",
                                      location=location, sha256=sha, size=size, encrypted=settings.encrypt,
                                      pieces=digests)
        sealed.append((entry, partial))
    return EncryptResult(tuple(sealed), external, deterministic)
