"""Releases in an OCI registry (`oci://host[:port]/repository[:tag]`), through the ORAS Python SDK.

One OCI artifact per release, in one of two layouts (`ortbuild release --oci-format`):
- "modelpack" (the default): a CNCF ModelPack model artifact (ortbuild.publish.modelpack: its artifactType, a
  model config made from the index, one raw layer per release file with ModelPack media types), which ModelPack
  clients and `oras pull` fetch as the release's files;
- "ortbuild" (the earlier one): its config blob is the bundle's index (media type CONFIG_TYPE) and its files are
  layers with ortbuild media types (LAYER_TYPES), each titled with its file name.
Either way, manifest annotations carry the target, the project, the providers, the precision, the epoch, the
creation time and the signing key id. Loopback registries are spoken to over plain HTTP; others over HTTPS
unless ORTBUILD_REGISTRY_INSECURE=1. Credentials come from the Docker config (~/.docker/config.json, `docker
login`), as with oras.

Pulling reads either layout and trusts nothing the registry says: each layer must be one of a release's files
(by media type; in a ModelPack artifact by its title, with the media type ortbuild gives that file), seen once,
its size within limits, and its bytes must hash to the layer's digest; the five files a release always has must
be there (the OpenSSF model signature, model.sig, is optional: older releases lack it); then `verify` checks
signatures and digests as for a local release.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortbuild import oci
from ortbuild.errors import ArtifactError, RegistryError
from ortbuild.oci import client as connect
from ortbuild.oci import fail
from ortbuild.oci_ref import Ref
from ortbuild.publish import modelpack, release

if TYPE_CHECKING:
    import oras.client

CONFIG_TYPE = "application/vnd.ortbuild.release.v1+json"
LAYER_TYPES = {"bundle": "application/vnd.ortbuild.bundle.v1.tar",
               "index": "application/vnd.ortbuild.release.index.v1+json",
               "provenance": "application/vnd.dsse.envelope.v1+json",
               "sums": "text/plain; charset=utf-8",
               "signature": "application/vnd.ortbuild.minisign.v1",
               "model_signature": "application/vnd.dev.sigstore.bundle.v0.3+json"}
REQUIRED = ("index", "bundle", "provenance", "sums", "signature")   # pushed in this order
OPTIONAL = ("model_signature",)                                    # the OpenSSF model signature (model.sig)
LAYOUTS = ("modelpack", "ortbuild")
OLD_LAYER_TYPES = {"application/vnd.ortbuild.bundle.v1.tar+gzip": "bundle"}  # the earlier format: still pulled
MAX_BLOB = {"bundle": 64 << 30}     # others: MAX_SMALL
MAX_SMALL = 64 << 20
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json")  # ORAS's get_manifest's Accept
def _kinds(ref: Ref, published: release.Published) -> list[str]:
    files = published.files
    unknown = sorted(set(files) - {*REQUIRED, *OPTIONAL})
    if unknown:
        raise RegistryError(f"cannot push to {ref}: the release has files of a kind this ortbuild does not know "
                            f"({', '.join(unknown)})", "push it with the ortbuild that released it")
    return [k for k in (*REQUIRED, *OPTIONAL) if k in files]


def push(ref: Ref, published: release.Published, layout: str = "modelpack") -> str:
    """Push a release's files (every kind in `published.files`) as one OCI artifact in `layout` (LAYOUTS); return
    the manifest digest."""
    import requests

    files, index = published.files, published.index
    kinds = _kinds(ref, published)
    known = modelpack.facts(published)
    annotations = modelpack.manifest_annotations(index, known)
    client = connect(ref)
    target = f"{ref.registry}/{ref.repository}:{ref.tag}"
    try:
        if layout == "ortbuild":
            resp = client.push(target=target, files=[f"{files[k]}:{LAYER_TYPES[k]}" for k in kinds],
                               manifest_config=f"{files['index']}:{CONFIG_TYPE}", manifest_annotations=annotations,
                               disable_path_validation=True, quiet=True, do_chunked=True)  # 16 MiB pieces
        else:
            resp = _push_modelpack(ref, client, target, published, kinds, known, annotations)
    except (requests.RequestException, ValueError, OSError) as e:
        raise fail(ref, "cannot push to", e) from None
    digest = resp.headers.get("Docker-Content-Digest", "")
    return str(digest)


def _push_modelpack(ref: Ref, client: oras.client.OrasClient, target: str, published: release.Published,
                    kinds: list[str], known: modelpack.Facts | None, annotations: dict[str, str]) -> Any:
    """The layers (each file's digest as the release wrote it: the bundle is never hashed again), the model config
    made from them, the manifest."""
    created = published.index["created"]
    blobs = [(published.files[k], modelpack.layer(k, published.files[k], created,
                                                  published.digests.get(published.files[k].name))) for k in kinds]
    return oci.push_artifact(ref, client, client.get_container(target), blobs,
                             modelpack.config(published.index, [d for _, d in blobs], known), modelpack.CONFIG_TYPE,
                             annotations, modelpack.ARTIFACT_TYPE)


def _layout(ref: Ref, man: object) -> Callable[[dict[str, Any]], str | None]:
    """How to tell a layer's kind in the manifest `man`: by its title (ModelPack) or its media type (ortbuild's
    layout); a manifest of neither is refused."""
    kinds = {**OLD_LAYER_TYPES, **{v: k for k, v in LAYER_TYPES.items()}}
    conf = man.get("config") if isinstance(man, dict) else None
    config_type = conf.get("mediaType") if isinstance(conf, dict) else None
    artifact = man.get("artifactType") if isinstance(man, dict) else None
    if config_type == modelpack.CONFIG_TYPE and artifact in (None, modelpack.ARTIFACT_TYPE):
        return modelpack.kind_of
    if config_type == CONFIG_TYPE:
        return lambda layer: kinds.get(layer.get("mediaType", ""))
    raise RegistryError(f"{ref}: not an ortbuild release (artifact type {artifact!r}, config media type "
                        f"{config_type!r})", "give the reference `ortbuild release` pushed")


def pull(ref: Ref, dest: Path) -> dict[str, Path]:
    """Download the release `ref` names into `dest` (an empty directory), checking every layer as described
    above, all of them (their sizes too) before any is downloaded. Returns kind -> file. Each request has a
    deadline (ortbuild.oci): a stalled registry is a RegistryError naming it (oci.Stalled), never a hang."""
    import requests

    client = connect(ref)
    if not ref.tag:
        raise RegistryError(f"{ref}: no tag", "name the release, e.g. " + str(ref.with_tag("0.1.0-cpu-fp32")))
    container = client.get_container(f"{ref.registry}/{ref.repository}:{ref.tag}")
    man = oci.get_manifest(ref, client, container, ", ".join(MANIFEST_TYPES))  # streamed, at most oci.MAX_MANIFEST
    if man is None:
        raise RegistryError(f"cannot read {ref}: the registry has no such tag (HTTP 404)",
                            "give the reference `ortbuild release` pushed")
    kind_of = _layout(ref, man)
    modelpack_made = kind_of is modelpack.kind_of
    wanted: dict[str, tuple[str, str, int]] = {}  # kind -> (title, digest, size)
    layers = man.get("layers")
    for layer in layers if isinstance(layers, list) else []:
        layer = layer if isinstance(layer, dict) else {}
        kind = kind_of(layer)
        title = (layer.get("annotations") or {}).get("org.opencontainers.image.title", "")
        size, digest = layer.get("size"), str(layer.get("digest", ""))
        if kind is None or kind in wanted or not isinstance(title, str) or \
                not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}", title) or \
                not isinstance(size, int) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryError(f"{ref}: layer {title!r} ({layer.get('mediaType')}) is not one of a release's files, "
                                "or is listed twice" + (" (a ModelPack artifact `ortbuild release` did not make?)"
                                                        if modelpack_made else ""), "never use this artifact")
        if not 0 <= size <= MAX_BLOB.get(kind, MAX_SMALL):
            raise RegistryError(f"{ref}: layer {title} declares {size} bytes, above the limit for a {kind}")
        wanted[kind] = (title, digest, size)
    missing = [k for k in REQUIRED if k not in wanted]
    if missing:
        raise RegistryError(f"{ref}: the artifact lacks the release's {', '.join(missing)}"
                            + (" (a ModelPack artifact `ortbuild release` did not make?)" if modelpack_made else ""),
                            "push the release again with `ortbuild release --to oci://...`")
    got: dict[str, Path] = {}
    for kind, (title, digest, size) in wanted.items():
        out = dest / title
        try:
            problem = oci.download(ref, client, container, digest, size, out)
        except (requests.RequestException, OSError) as e:
            raise fail(ref, f"cannot download {title} from", e) from None
        if problem == "longer":
            raise RegistryError(f"{ref}: layer {title} is longer than its declared {size} bytes")
        if problem is not None:
            raise ArtifactError(f"{ref}: layer {title} does not match its digest {digest}", "pull again")
        got[kind] = out
    return got
