"""OCI registries: references (`oci://host[:port]/repository[:tag]`) and a client for one (the ORAS Python SDK,
imported lazily), shared by releases (ortbuild.publish.registry) and the build cache (ortbuild.pipeline.cache).

Loopback registries are spoken to over plain HTTP; others over HTTPS unless ORTBUILD_REGISTRY_INSECURE=1.
Credentials come from the Docker config (~/.docker/config.json, `docker login`), as with oras.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.errors import RegistryError

if TYPE_CHECKING:
    import oras.client

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
