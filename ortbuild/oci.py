"""OCI registries: a client for one given its reference (ortbuild.oci_ref; the ORAS Python SDK, imported lazily),
and the transfers both users make, pushing an artifact of files, reading a manifest and streaming a checked blob
into a file; shared by releases (ortbuild.publish.registry) and the build cache (ortbuild.pipeline.cache).

Loopback registries are spoken to over plain HTTP; others over HTTPS unless ORTBUILD_REGISTRY_INSECURE=1.
Credentials come from the Docker config (~/.docker/config.json, `docker login`), as with oras.

Every request has a deadline for all of it (connecting, the headers and the body together), not only a timeout
between two reads, which a registry sending a byte now and then never reaches: REQUEST_DEADLINE seconds
($ORTBUILD_REGISTRY_DEADLINE), and for a blob that plus a second per MiB received (a download: never by what
the registry declares) or sent (an upload) (MIN_RATE). When it passes, a watchdog shuts the request's socket
down and the request is a Stalled error naming the registry, what stalled and the deadline; it is never
retried. A manifest is read streaming and refused past MAX_MANIFEST
bytes (declared or read), never read whole first.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from ortbuild.errors import RegistryError
from ortbuild.oci_ref import Ref

if TYPE_CHECKING:
    import oras.client
    import requests
    import requests.adapters

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
REQUEST_DEADLINE = 30.0         # seconds for a whole request: the /v2/ probe, a manifest, an upload's small requests
MIN_RATE = 1 << 20              # bytes per second a blob download or upload is given on top of that
MAX_MANIFEST = 4 << 20          # OCI's limit for a manifest registries must accept
CONNECT_TIMEOUT = 10.0          # seconds to connect, and between two reads (within the deadline)
READ_TIMEOUT = 60.0
RETRY_PAUSES = (3, 5, 11, 29, 83)  # ORAS's own retries of an error (not of a stall), where a client retries

# ----------------------------------------------------------------------------------------- deadlines

class Stalled(RegistryError):
    """A registry request got no complete answer within its deadline (the registry is asked nothing more)."""


def request_deadline() -> float:
    """REQUEST_DEADLINE, or $ORTBUILD_REGISTRY_DEADLINE (seconds) where it is set."""
    text = os.environ.get("ORTBUILD_REGISTRY_DEADLINE", "").strip()
    if not text:
        return REQUEST_DEADLINE
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 1e9:
        raise RegistryError(f"ORTBUILD_REGISTRY_DEADLINE={text!r} is not a number of seconds above 0",
                            f"unset it (a request then has {REQUEST_DEADLINE:g} s) or give e.g. 120")
    return seconds


def blob_deadline(size: int) -> float:
    """The deadline of a blob's transfer: the request's, plus a second per MiB of it."""
    return request_deadline() + size / MIN_RATE


_local = threading.local()     # the deadline scope of this thread's registry request, if any


class _Scope:
    """One deadline: the sockets its requests use (dups: the watchdog's own references, which survive a TLS wrap)
    are shut down when it passes, which ends a read blocked on any of them."""

    def __init__(self, ref: Ref, seconds: float, what: str) -> None:
        self.ref, self.seconds, self.what = ref, seconds, what
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.expired = self.closed = False
        self.timer = threading.Timer(seconds, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def watch(self, sock: socket.socket) -> None:
        try:
            copy = socket.fromfd(sock.fileno(), sock.family, sock.type)
        except OSError:
            return
        with self.lock:
            if self.closed:
                copy.close()
                return
            self.socks.append(copy)
            if self.expired:
                _shut(copy)

    def extend(self, seconds: float) -> None:
        """Move the deadline to `seconds` after the start of the scope (never earlier): a transfer that keeps
        arriving keeps its time."""
        with self.lock:
            self.end = max(self.end, self.start + seconds)

    def expire(self) -> None:
        with self.lock:
            if self.closed:
                return
            left = self.end - time.monotonic()
            if left > 0.05:  # extended meanwhile: wait for the new deadline
                self.timer = threading.Timer(left, self.expire)
                self.timer.daemon = True
                self.timer.start()
                return
            self.expired = True
            for s in self.socks:
                _shut(s)

    def close(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.closed = True
            for s in self.socks:
                s.close()
            self.socks.clear()

    def stalled(self) -> Stalled:
        return Stalled(f"{self.ref}: no complete answer within {self.seconds:g} s to {self.what} (a stalled "
                       "registry)", "the registry accepted the connection but answers too slowly: check it and the "
                                    "network to it; ORTBUILD_REGISTRY_DEADLINE=<seconds> gives each request longer "
                                    f"(a blob: that plus 1 s per MiB; default {REQUEST_DEADLINE:g})")


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def deadline(ref: Ref, seconds: float, what: str) -> _Deadline:
    """A deadline of `seconds` for the registry requests made inside it by this thread (connecting, the headers
    and the body together); Stalled on the way out when it passed. Inside another one, that one holds (a
    transfer's requests share the transfer's deadline)."""
    return _Deadline(ref, seconds, what)


class _Deadline:
    def __init__(self, ref: Ref, seconds: float, what: str) -> None:
        self.ref, self.seconds, self.what = ref, seconds, what

    def __enter__(self) -> None:
        self.outer: _Scope | None = getattr(_local, "scope", None)
        self.scope = self.outer or _Scope(self.ref, self.seconds, self.what)
        _local.scope = self.scope

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.outer is None:
            _local.scope = None
            self.scope.close()
        if self.scope.expired and not isinstance(e, Stalled) and (e is None or isinstance(e, Exception)):
            raise self.scope.stalled() from None


def _watch(sock: socket.socket | None) -> None:
    scope: _Scope | None = getattr(_local, "scope", None)
    if scope is not None and sock is not None:
        scope.watch(sock)


def _left() -> float:
    scope: _Scope | None = getattr(_local, "scope", None)
    return max(0.1, scope.end - time.monotonic()) if scope is not None else float("inf")


@functools.cache
def _adapter() -> type[requests.adapters.HTTPAdapter]:
    """requests' HTTPAdapter with connections whose sockets (new or reused) join the current deadline scope."""
    import requests.adapters
    import urllib3.connection
    import urllib3.connectionpool
    import urllib3.poolmanager

    class Connection(urllib3.connection.HTTPConnection):
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            _watch(sock)
            return sock

        def request(self, *args: Any, **kwargs: Any) -> None:
            _watch(self.sock)  # a kept-alive connection, used again
            super().request(*args, **kwargs)

    class TLSConnection(Connection, urllib3.connection.HTTPSConnection):
        pass

    class Pool(urllib3.connectionpool.HTTPConnectionPool):
        ConnectionCls = Connection

    class TLSPool(urllib3.connectionpool.HTTPSConnectionPool):
        ConnectionCls = TLSConnection

    def watched(manager: urllib3.poolmanager.PoolManager) -> urllib3.poolmanager.PoolManager:
        if manager.pool_classes_by_scheme == urllib3.poolmanager.pool_classes_by_scheme:
            manager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}  # (not a SOCKS proxy's)
        return manager

    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            watched(self.poolmanager)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> urllib3.poolmanager.PoolManager:
            return watched(super().proxy_manager_for(proxy, **kwargs))

        def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
            if kwargs.get("timeout") is None:
                left = _left()
                kwargs["timeout"] = (min(CONNECT_TIMEOUT, left), min(READ_TIMEOUT, left))
            return super().send(request, *args, **kwargs)

    return Adapter


def _mount(session: requests.Session) -> None:
    for scheme in ("http://", "https://"):
        session.mount(scheme, _adapter()())


# ----------------------------------------------------------------------------------------- a client

def client(ref: Ref, retries: bool = True) -> oras.client.OrasClient:
    """An ORAS client for the registry, after one quick request to it (GET /v2/, within the deadline): ORAS
    retries a refused connection for over two minutes (3 + 5 + 11 + 29 + 83 s), which is right for a flaky
    network, not for a wrong address. Each of its requests has a deadline (module doc) and is retried after an
    error as ORAS does where `retries`, else made once; a stall is never retried."""
    import oras.client
    import requests

    try:
        with requests.Session() as session, deadline(ref, request_deadline(), "GET /v2/"):
            _mount(session)
            session.get(f"{'http' if ref.insecure else 'https'}://{ref.registry}/v2/", stream=True).close()
    except requests.RequestException as e:
        raise fail(ref, "cannot reach", e) from None
    c = oras.client.OrasClient(hostname=ref.registry, insecure=ref.insecure)
    _mount(c.session)
    _requests(ref, c, retries)
    return c


def _requests(ref: Ref, c: oras.client.OrasClient, retries: bool) -> None:
    """ORAS's do_request without its retry decorator, each request within its deadline (an upload's: by its
    bytes); retried as ORAS does (an error or a 500) where `retries`, except after a stall."""
    import oras.auth
    import requests

    plain = getattr(type(c).do_request, "__wrapped__", None)
    if plain is None:  # not the ORAS this was written for: its own requests, with timeouts between reads only
        return

    def do_request(url: str, method: str = "GET", data: object = None, headers: dict[str, str] | None = None,
                   json: object = None, stream: bool = False) -> requests.Response:
        seconds = blob_deadline(len(data)) if isinstance(data, bytes) else request_deadline()
        if method == "GET" and "/blobs/" in url:  # a blob as stored: no Content-Encoding (download reads it raw)
            headers = {**(headers or {}), "Accept-Encoding": "identity"}
        what = f"{method} /{url.split('://', 1)[-1].split('/', 1)[-1].split('?')[0][:120]}"
        for pause in (*(RETRY_PAUSES if retries else ()), None):
            try:
                with deadline(ref, seconds, what):
                    r: requests.Response = plain(c, url, method, data, headers, json, stream)
                if r.status_code != 500 or pause is None:
                    return r
            except (Stalled, requests.exceptions.SSLError, oras.auth.AuthenticationException):
                raise
            except Exception:
                if pause is None:
                    raise
            time.sleep(min(pause, _left()))  # a transfer's deadline passing meanwhile: a stall, at once
        raise AssertionError("unreachable")

    c.do_request = do_request


def fail(ref: Ref, action: str, e: Exception) -> RegistryError:
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return RegistryError(f"{action} {ref}: {text}", "is the registry running and reachable, and are you logged in "
                                                   "(`docker login`)? Loopback registries use HTTP, others HTTPS")


# ----------------------------------------------------------------------------------------- transfers

def get_manifest(ref: Ref, c: oras.client.OrasClient, container: Any, accept: str) -> Any:
    """The manifest `container` names, parsed (None: the registry has no such tag), read streaming within the
    request deadline and refused past MAX_MANIFEST bytes, declared or read (never read whole first). Every other
    problem is a RegistryError naming `ref` (Stalled for a stall)."""
    import requests

    c.auth.load_configs(container)  # the Docker config's credentials, as ORAS's get_manifest
    url = f"{c.prefix}://{container.manifest_url()}"
    limit = f"more than the {MAX_MANIFEST >> 20} MiB a manifest may be"
    try:
        with deadline(ref, request_deadline(), "a manifest request"), \
                c.do_request(url, "GET", headers={"Accept": accept}, stream=True) as r:
            if r.status_code == 404:
                return None
            if r.status_code != 200:
                raise RegistryError(f"cannot read {ref}: the registry answered {r.status_code}",
                                    "is the reference right, and are you logged in (`docker login`)?")
            declared = r.headers.get("Content-Length", "").strip()
            if declared.isdigit() and int(declared) > MAX_MANIFEST:
                raise RegistryError(f"cannot read {ref}: its manifest declares {int(declared)} bytes, {limit}")
            body = bytearray()
            for chunk in r.iter_content(chunk_size=64 << 10):
                body += chunk
                if len(body) > MAX_MANIFEST:
                    raise RegistryError(f"cannot read {ref}: its manifest is {limit}")
    except requests.RequestException as e:
        raise fail(ref, "cannot read", e) from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep
        raise RegistryError(f"cannot read {ref}: its manifest is not JSON ({str(e)[:200]})") from None


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


def download(ref: Ref, client: oras.client.OrasClient, container: Any, digest: str, size: int,
             out: Path) -> Literal["longer", "digest"] | None:
    """Stream the blob `digest` into the new file `out` (created exclusively, 1 MiB at a time, never whole in
    memory) within blob_deadline(size): None when its bytes are the layer's, else why not ("longer": more than
    `size` bytes, read no further; "digest": another size or digest). Stalled when the deadline passes; an HTTP
    error status, requests' and file errors are the caller's to name."""
    h, n = hashlib.sha256(), 0
    base = request_deadline()
    with deadline(ref, base, f"the download of {digest[:19]}… ({size} bytes; a blob has {base:g} s plus 1 s per "
                             "MiB received)"), \
            client.get_blob(container, digest, stream=True) as r, open(out, "xb") as f:
        r.raise_for_status()
        scope: _Scope = _local.scope
        # read1: what has arrived, at once (a registry sending a byte now and then is seen doing so), never more
        # than 1 MiB, as sent (never decoded: a Content-Encoding would count, and grow, what the registry did not
        # send; a blob's digest is of its bytes as stored); the deadline moves on by a second per MiB received,
        # never by what the registry declares
        while chunk := r.raw.read1(1 << 20, decode_content=False):
            n += len(chunk)
            if n > size:
                return "longer"
            scope.extend(base + n / MIN_RATE)
            h.update(chunk)
            f.write(chunk)
    return None if n == size and "sha256:" + h.hexdigest() == digest else "digest"
