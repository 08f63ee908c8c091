"""OCI registries: references (`oci://host[:port]/repository[:tag]`), a client for one (the ORAS Python SDK,
imported lazily), and the two transfers both users make, pushing an artifact of files and streaming a checked
blob into a file; shared by releases (ortbuild.publish.registry) and the build cache (ortbuild.pipeline.cache).

Loopback registries are spoken to over plain HTTP; others over HTTPS unless ORTBUILD_REGISTRY_INSECURE=1.
Credentials come from the Docker config (~/.docker/config.json, `docker login`), as with oras.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ortbuild.errors import RegistryError

if TYPE_CHECKING:
    import oras.client

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"

REF = re.compile(r"^oci://(?P<host>[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d{1,5}))?/"
                 r"(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
                 r"(?::(?P<tag>[A-Za-z0-9_{][A-Za-z0-9_.{}-]{0,127}))?$")


@dataclass(frozen=True)
class Ref:
    host: str
    port: int | None
    repository: str
    tag: str | None

    @property
    def registry(self) -> str:
        return f"{self.host}:{self.port}" if self.port else self.host

    def with_tag(self, tag: str) -> Ref:
        return Ref(self.host, self.port, self.repository, tag)

    def __str__(self) -> str:
        return f"oci://{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "")

    @property
    def insecure(self) -> bool:
        if os.environ.get("ORTBUILD_REGISTRY_INSECURE") == "1" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False


def is_ref(text: str) -> bool:
    return text.startswith("oci://")


def parse(text: str) -> Ref:
    m = REF.match(text)
    if not m:
        raise RegistryError(f"'{text}' is not an OCI reference", "write oci://host[:port]/repository[:tag], e.g. "
                                                                  "oci://localhost:5000/models:0.1.0-cpu-fp32")
    return Ref(m["host"], int(m["port"]) if m["port"] else None, m["repo"], m["tag"])


def client(ref: Ref) -> oras.client.OrasClient:
    """An ORAS client for the registry, after one quick request to it: ORAS retries a refused connection for
    over two minutes (3 + 5 + 11 + 29 + 83 s), which is right for a flaky network, not for a wrong address."""
    import oras.client
    import requests

    try:
        requests.get(f"{'http' if ref.insecure else 'https'}://{ref.registry}/v2/", timeout=15).close()
    except requests.RequestException as e:
        raise fail(ref, "cannot reach", e) from None
    return oras.client.OrasClient(hostname=ref.registry, insecure=ref.insecure)


def fail(ref: Ref, action: str, e: Exception) -> RegistryError:
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return RegistryError(f"{action} {ref}: {text}", "is the registry running and reachable, and are you logged in "
                                                   "(`docker login`)? Loopback registries use HTTP, others HTTPS")


def push_artifact(ref: Ref, client: oras.client.OrasClient, container: Any,
                  blobs: Sequence[tuple[Path, dict[str, Any]]], config: bytes, config_type: str,
                  annotations: dict[str, str], artifact_type: str | None = None) -> Any:
    """Push an OCI artifact: each (file, layer descriptor) blob in 16 MiB pieces (never whole in memory), then the
    config blob (`config`, of `config_type`), then the manifest; the manifest's response. A refusal is a
    RegistryError naming what was refused."""
    def sent(r: Any, what: str) -> Any:
        if r.status_code not in (200, 201, 202):
            raise RegistryError(f"cannot push {what} to {ref}: HTTP {r.status_code} {r.text.strip()[:300]}",
                                "is the repository writable with your login (`docker login`)?")
        return r

    for path, desc in blobs:
        sent(client.upload_blob(str(path), container, desc, do_chunked=True), path.name)
    with tempfile.TemporaryDirectory(prefix="ortbuild-push-") as tmp:
        (Path(tmp) / "config.json").write_bytes(config)
        conf = {"mediaType": config_type, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                "size": len(config)}
        sent(client.upload_blob(str(Path(tmp) / "config.json"), container, conf), "the config")
    manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": conf,
                                "layers": [desc for _, desc in blobs], "annotations": annotations}
    if artifact_type is not None:
        manifest["artifactType"] = artifact_type
    return sent(client.upload_manifest(manifest, container), "the manifest")


def download(client: oras.client.OrasClient, container: Any, digest: str, size: int,
             out: Path) -> Literal["longer", "digest"] | None:
    """Stream the blob `digest` into the new file `out` (created exclusively, 1 MiB at a time, never whole in
    memory): None when its bytes are the layer's, else why not ("longer": more than `size` bytes, read no further;
    "digest": another size or digest). An HTTP error status, requests' and file errors are the caller's to name."""
    h, n = hashlib.sha256(), 0
    with client.get_blob(container, digest, stream=True) as r, open(out, "xb") as f:
        r.raise_for_status()
        for chunk in r.iter_content(chunk_size=1 << 20):
            n += len(chunk)
            if n > size:
                return "longer"
            h.update(chunk)
            f.write(chunk)
    return None if n == size and "sha256:" + h.hexdigest() == digest else "digest"
