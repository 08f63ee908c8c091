"""Releases in an OCI registry (`oci://host[:port]/repository[:tag]`), through the ORAS Python SDK.

One OCI artifact per release: its config blob is the bundle's index (media type CONFIG_TYPE, so registry tools
show what it is), and its five files are layers, each titled with its file name. Manifest annotations carry
the target, the project, the creation time and the signing key id. Loopback registries are spoken to over
plain HTTP; others over HTTPS unless ORTBUILD_REGISTRY_INSECURE=1. Credentials come from the Docker config
(~/.docker/config.json, `docker login`), as with oras.

Pulling trusts nothing the registry says: each layer's title must be one of the release's plain file names,
seen once, its size within limits, and its bytes must hash to the layer's digest; then `verify` checks
signatures and digests as for a local release.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild.errors import ArtifactError, RegistryError
from ortbuild.publish import release

if TYPE_CHECKING:
    import oras.client

CONFIG_TYPE = "application/vnd.ortbuild.release.v1+json"
LAYER_TYPES = {"bundle": "application/vnd.ortbuild.bundle.v1.tar",
               "index": "application/vnd.ortbuild.release.index.v1+json",
               "provenance": "application/vnd.dsse.envelope.v1+json",
               "sums": "text/plain; charset=utf-8",
               "signature": "application/vnd.ortbuild.minisign.v1"}
OLD_LAYER_TYPES = {"application/vnd.ortbuild.bundle.v1.tar+gzip": "bundle"}  # the earlier format: still pulled
MAX_BLOB = {"bundle": 64 << 30}     # others: MAX_SMALL
MAX_SMALL = 64 << 20
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


def _client(ref: Ref) -> oras.client.OrasClient:
    """An ORAS client for the registry, after one quick request to it: ORAS retries a refused connection for
    over two minutes (3 + 5 + 11 + 29 + 83 s), which is right for a flaky network, not for a wrong address."""
    import oras.client
    import requests

    try:
        requests.get(f"{'http' if ref.insecure else 'https'}://{ref.registry}/v2/", timeout=15).close()
    except requests.RequestException as e:
        raise _fail(ref, "cannot reach", e) from None
    return oras.client.OrasClient(hostname=ref.registry, insecure=ref.insecure)


def _fail(ref: Ref, action: str, e: Exception) -> RegistryError:
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return RegistryError(f"{action} {ref}: {text}", "is the registry running and reachable, and are you logged in "
                                                   "(`docker login`)? Loopback registries use HTTP, others HTTPS")


def push(ref: Ref, published: release.Published) -> str:
    """Push a release's files as one OCI artifact; return the manifest digest."""
    import requests

    files, index = published.files, published.index
    annotations = {"org.opencontainers.image.title": index["name"],
                   "org.opencontainers.image.version": index["project"]["version"],
                   "org.opencontainers.image.created": index["created"],
                   "org.opencontainers.image.description": index.get("description", ""),
                   "dev.ortbuild.target": index["target"], "dev.ortbuild.runtime": index["runtime"],
                   "dev.ortbuild.models": ",".join(index["models"]),
                   "dev.ortbuild.public-key-id": index["signing"]["public_key_id"],
                   "dev.ortbuild.forced": str(bool(index["forced"])).lower()}
    try:
        resp = _client(ref).push(
            target=f"{ref.registry}/{ref.repository}:{ref.tag}",
            files=[f"{files[k]}:{LAYER_TYPES[k]}" for k in ("index", "bundle", "provenance", "sums", "signature")],
            manifest_config=f"{files['index']}:{CONFIG_TYPE}", manifest_annotations=annotations,
            disable_path_validation=True, quiet=True, do_chunked=True)  # 16 MiB pieces: never the bundle whole
    except (requests.RequestException, ValueError, OSError) as e:
        raise _fail(ref, "cannot push to", e) from None
    digest = resp.headers.get("Docker-Content-Digest", "")
    return str(digest)


def pull(ref: Ref, dest: Path) -> dict[str, Path]:
    """Download the release `ref` names into `dest` (an empty directory), checking every layer as described
    above. Returns kind -> file."""
    import requests

    client = _client(ref)
    if not ref.tag:
        raise RegistryError(f"{ref}: no tag", "name the release, e.g. " + str(ref.with_tag("0.1.0-cpu-fp32")))
    try:
        container = client.get_container(f"{ref.registry}/{ref.repository}:{ref.tag}")
        man = client.get_manifest(container)
    except (requests.RequestException, ValueError, OSError) as e:
        raise _fail(ref, "cannot read", e) from None
    if man.get("config", {}).get("mediaType") != CONFIG_TYPE:
        raise RegistryError(f"{ref}: not an ortbuild release (config media type "
                            f"{man.get('config', {}).get('mediaType')!r})", "give the reference `ortbuild release` "
                                                                            "pushed")
    kinds = {**OLD_LAYER_TYPES, **{v: k for k, v in LAYER_TYPES.items()}}
    got: dict[str, Path] = {}
    for layer in man.get("layers", []):
        kind = kinds.get(layer.get("mediaType", ""))
        title = (layer.get("annotations") or {}).get("org.opencontainers.image.title", "")
        size, digest = layer.get("size"), str(layer.get("digest", ""))
        if kind is None or kind in got or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}", title) or \
                not isinstance(size, int) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryError(f"{ref}: layer {title!r} ({layer.get('mediaType')}) is not one of a release's files, "
                                "or is listed twice", "never use this artifact")
        if size > MAX_BLOB.get(kind, MAX_SMALL):
            raise RegistryError(f"{ref}: layer {title} declares {size} bytes, above the limit for a {kind}")
        out = dest / title
        h, n = hashlib.sha256(), 0
        try:
            with client.get_blob(container, digest, stream=True) as r, open(out, "xb") as f:
                r.raise_for_status()
                for chunk in r.iter_content(chunk_size=1 << 20):
                    n += len(chunk)
                    if n > size:
                        raise RegistryError(f"{ref}: layer {title} is longer than its declared {size} bytes")
                    h.update(chunk)
                    f.write(chunk)
        except (requests.RequestException, OSError) as e:
            raise _fail(ref, f"cannot download {title} from", e) from None
        if n != size or "sha256:" + h.hexdigest() != digest:
            raise ArtifactError(f"{ref}: layer {title} does not match its digest {digest}", "pull again")
        got[kind] = out
    missing = sorted(set(LAYER_TYPES) - set(got))
    if missing:
        raise RegistryError(f"{ref}: the artifact lacks the release's {', '.join(missing)}", "push the release again")
    return got
