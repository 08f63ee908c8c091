"""OCI references: `oci://host[:port]/repository[:tag]` parsed into a `Ref` (a loopback registry's is spoken to
over plain HTTP, others over HTTPS unless ORTBUILD_REGISTRY_INSECURE=1); the client and the transfers: ortbuild.oci.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

from ortbuild.errors import RegistryError

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
