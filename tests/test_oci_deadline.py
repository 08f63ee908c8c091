"""Registry requests have a deadline for the whole request, and manifests a size cap (ortbuild.oci), against
misbehaving registries served here on loopback: one that sends a byte every half second (a stall: per-read
timeouts never fire on it), one that answers a manifest with 1.5 GB declared or with junk that never ends. A
cached build warns, naming the registry, and asks it nothing more; `ortbuild pull` fails with exit 11 naming the
registry and what stalled; neither waits past a few times the deadline (ORTBUILD_REGISTRY_DEADLINE, shortened
here), and a manifest is refused after at most its cap has been read."""

from __future__ import annotations

import functools
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ortbuild import cli, oci, oci_ref
from ortbuild.errors import RegistryError, Tampered
from ortbuild.pipeline import cache
from ortbuild.publish import registry
from tests.test_cache import build, project, statuses
from tests.test_release import public_key_file

DEADLINE = 2.5           # seconds (ORTBUILD_REGISTRY_DEADLINE): every run below must end within 4x this
TRICKLE_FOR = 40.0       # the slow server gives up after this (so that code without a deadline fails, not hangs)
JUNK_LIMIT = 128 << 20   # what the junk server sends at most


@dataclass
class Server:
    """A registry-shaped TCP server: `mode` says how it answers (below); it counts connections, requests and bytes
    sent, and when a client hung up on a trickle (seconds after the connection)."""

    mode: str
    port: int = 0
    connections: int = 0
    requests: list[str] = field(default_factory=list)
    sent: int = 0
    hung_up_after: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.port}"


def _head(sock: object, buf: bytearray) -> str | None:
    """The next request's first line (its head read whole), or None when the client closed."""
    import socket

    assert isinstance(sock, socket.socket)
    while b"\r\n\r\n" not in buf:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    return head.split(b"\r\n")[0].decode()


BLOB = 100 << 20  # the bundle a "blob-trickle" registry declares


def _release_manifest() -> bytes:
    """A release manifest in ortbuild's layout whose layers are well formed (the bundle first, 100 MiB declared)."""
    import json

    digest = "sha256:" + "ab" * 32
    layers = [{"mediaType": registry.LAYER_TYPES[k], "size": BLOB if k == "bundle" else 10, "digest": digest,
               "annotations": {"org.opencontainers.image.title": f"{k}.bin"}}
              for k in ("bundle", *[k for k in registry.REQUIRED if k != "bundle"])]
    return json.dumps({"schemaVersion": 2, "mediaType": oci.MANIFEST_TYPE, "layers": layers,
                       "config": {"mediaType": registry.CONFIG_TYPE, "size": 2, "digest": digest}}).encode()


@functools.cache
def gzip_bomb() -> bytes:
    """About 1 MiB on the wire, 1 GiB inflated (made on first use: 5 s of compression)."""
    import gzip
    import io

    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as z:
        for _ in range(1024):
            z.write(bytes(1 << 20))
    return out.getvalue()


def _cache_manifest() -> bytes:
    """A cache entry's OCI manifest whose manifest.json layer declares 1 GiB (read whole once fetched)."""
    import json

    digest = "sha256:" + "cd" * 32
    layers = [{"mediaType": cache.FILE_TYPE, "size": 1 << 30 if n == "manifest.json" else 10, "digest": digest,
               "annotations": {"org.opencontainers.image.title": n}} for n in ("manifest.json", "manifest.sig")]
    return json.dumps({"schemaVersion": 2, "mediaType": oci.MANIFEST_TYPE, "layers": layers,
                       "config": {"mediaType": cache.ENTRY_TYPE, "size": 2, "digest": digest}}).encode()


def _handler(server: Server) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            server.connections += 1
            opened, buf = time.monotonic(), bytearray()
            while (line := _head(self.request, buf)) is not None:
                server.requests.append(line)
                path = line.split(" ")[1]
                if server.mode == "trickle" or (path != "/v2/" and server.mode == "trickle-body"):
                    self.trickle(opened, path != "/v2/")
                    return
                if path == "/v2/":
                    self.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
                    continue
                manifests = {"blob-trickle": _release_manifest, "gzip-blob": _release_manifest,
                             "cache-bigman": _cache_manifest}
                if server.mode in manifests and "/manifests/" in path:
                    body = manifests[server.mode]()
                    self.send(b"HTTP/1.1 200 OK\r\nContent-Type: " + oci.MANIFEST_TYPE.encode()
                              + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                    continue
                if server.mode == "gzip-blob":  # 1 MiB of gzip that inflates to 1 GiB, sent as the bundle
                    self.send(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                              + str(len(gzip_bomb())).encode() + b"\r\n\r\n" + gzip_bomb())
                    return
                if server.mode == "blob-trickle":  # the bundle's blob: 100 MiB declared, a byte every half second
                    self.trickle(opened, True, declared=BLOB)
                    return
                if server.mode == "nested":
                    self.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100000)
                    continue
                self.junk(declared=server.mode == "junk-declared")
                return

        def send(self, data: bytes) -> None:
            self.request.sendall(data)
            server.sent += len(data)

        def trickle(self, opened: float, body: bool, declared: int = 100000) -> None:
            """A byte every half second: of the headers, or (`body`) of the body after whole headers."""
            if body:
                self.send(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(declared).encode() + b"\r\n\r\n")
            data = b"X" * 100000 if body else b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100000
            for i in range(len(data)):
                if server.stop.is_set() or time.monotonic() - opened > TRICKLE_FOR:
                    return
                try:
                    self.send(data[i:i + 1])
                except OSError:
                    server.hung_up_after.append(time.monotonic() - opened)
                    return
                time.sleep(0.5)

        def junk(self, declared: bool) -> None:
            """A manifest answer: 1.5 GB declared (`declared`) or no length at all, then junk as fast as the client
            takes it, up to JUNK_LIMIT."""
            self.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
                      + (b"Content-Length: 1500000000\r\n" if declared else b"Connection: close\r\n") + b"\r\n")
            piece = b"[" * (64 << 10)
            try:
                while server.sent < JUNK_LIMIT and not server.stop.is_set():
                    self.send(piece)
            except OSError:
                pass

    return Handler


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Server]]:
    """Start a Server of a mode: `serve("trickle")` (every request gets a byte every half second: the /v2/ probe's
    headers, any other request's body), "trickle-body" (the probe answered at once, a manifest's body trickles),
    "junk-declared", "junk-streamed" (the probe answered, a manifest of junk: 1.5 GB declared, or no length),
    "nested" (a small manifest of arrays nested 100,000 deep). The deadline is DEADLINE seconds."""
    monkeypatch.setenv("ORTBUILD_REGISTRY_DEADLINE", str(DEADLINE))
    servers: list[tuple[Server, socketserver.ThreadingTCPServer]] = []

    def start(mode: str) -> Server:
        s = Server(mode)
        tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(s))
        tcp.daemon_threads = True
        s.port = tcp.server_address[1]
        threading.Thread(target=tcp.serve_forever, daemon=True).start()
        servers.append((s, tcp))
        return s

    yield start
    for s, tcp in servers:
        s.stop.set()
        tcp.shutdown()
        tcp.server_close()


# not `runtime`: it checks the registry's deadline, which no flavor changes
def test_a_stalled_registry_is_a_warning_naming_it_and_the_build_asks_it_nothing_more(
        tmp_path: Path, serve: Callable[[str], Server]) -> None:
    server = serve("trickle")
    start = time.monotonic()
    jobs = build(project(tmp_path / "a"), "--cache", f"oci://{server.where}/cache", "-j", "1")
    took = time.monotonic() - start
    assert set(statuses(jobs).values()) == {"built"}, jobs
    warnings = [n for j in jobs for n in j["notes"] if "WARNING" in n]  # type: ignore[attr-defined]
    assert len(warnings) == 1, warnings
    assert (f"oci://{server.where}/cache" in warnings[0] and f"no complete answer within {DEADLINE:g} s" in warnings[0]
            and "GET /v2/" in warnings[0] and "stalled" in warnings[0] and "not used for the rest" in warnings[0]), \
        warnings
    assert server.connections == 1 and server.requests == ["GET /v2/ HTTP/1.1"], server.requests  # nothing more
    assert took < 4 * DEADLINE, took  # without a deadline: TRICKLE_FOR, and forever with a registry that never stops
    time.sleep(1.2)  # the server notices the hang-up at its next byte
    assert server.hung_up_after and server.hung_up_after[0] < DEADLINE + 3, server.hung_up_after  # a send or two


@pytest.mark.parametrize("mode", ["trickle", "trickle-body"])
def test_pull_from_a_stalled_registry_fails_naming_it_within_the_deadline(
        tmp_path: Path, serve: Callable[[str], Server], capsys: pytest.CaptureFixture[str], mode: str) -> None:
    server = serve(mode)
    ref = f"oci://{server.where}/r:tag"
    start = time.monotonic()
    code = cli.main(["pull", ref, "--public-key", str(public_key_file(tmp_path)), "--to", str(tmp_path / "d")])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == RegistryError.exit_code == 11, err
    stalled = "GET /v2/" if mode == "trickle" else "a manifest request"
    assert f"{ref}: no complete answer within {DEADLINE:g} s to {stalled} (a stalled registry)" in err, err
    assert "ORTBUILD_REGISTRY_DEADLINE" in err and "Traceback" not in err, err
    assert took < 4 * DEADLINE, took
    assert not (tmp_path / "d").exists()


def test_a_blob_that_trickles_is_given_up_on_by_what_arrives_not_by_what_is_declared(
        tmp_path: Path, serve: Callable[[str], Server], capsys: pytest.CaptureFixture[str]) -> None:
    """A registry declares a 100 MiB bundle and sends it a byte at a time: a deadline scaled by the declared size
    would wait 100 s more; the download's deadline moves on only by what arrives (1 s per MiB)."""
    server = serve("blob-trickle")
    ref = f"oci://{server.where}/r:tag"
    start = time.monotonic()
    code = cli.main(["pull", ref, "--public-key", str(public_key_file(tmp_path)), "--to", str(tmp_path / "d")])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == RegistryError.exit_code, err
    assert f"no complete answer within {DEADLINE:g} s to the download of" in err and "Traceback" not in err, err
    assert took < 4 * DEADLINE, took


@pytest.mark.parametrize("mode", ["junk-declared", "junk-streamed"])
@pytest.mark.parametrize("reader", ["pull", "cache"])
def test_a_huge_manifest_is_refused_before_it_is_read(tmp_path: Path, serve: Callable[[str], Server], mode: str,
                                                      reader: str) -> None:
    """1.5 GB declared: refused on its Content-Length; no length, junk without end: refused once the cap is read.
    Either way the registry gets to send little more than the 4 MiB cap (socket buffers), never the whole."""
    server = serve(mode)
    start = time.monotonic()
    if reader == "pull":
        with pytest.raises(RegistryError) as e:
            registry.pull(oci_ref.parse(f"oci://{server.where}/r:tag"), tmp_path)
        message = e.value.message
    else:
        c = cache.configured(tmp_path / "targets.toml", "", f"oci://{server.where}/cache", False)
        assert c is not None
        with pytest.raises(cache.CacheProblem) as p:
            c.fetch("0" * 64, tmp_path)
        message = p.value.message
    assert server.where in message and "4 MiB a manifest may be" in message, message
    assert ("declares 1500000000 bytes" in message) == (mode == "junk-declared"), message
    assert server.sent < 32 << 20, server.sent  # of JUNK_LIMIT (128 MiB) and the 1.5 GB declared
    assert time.monotonic() - start < 4 * DEADLINE
    assert not list(tmp_path.iterdir())


def test_a_manifest_nested_too_deep_for_json_is_refused_not_a_crash(tmp_path: Path,
                                                                    serve: Callable[[str], Server]) -> None:
    server = serve("nested")
    with pytest.raises(RegistryError, match="its manifest is not JSON"):
        registry.pull(oci_ref.parse(f"oci://{server.where}/r:tag"), tmp_path)


def test_a_bad_deadline_setting_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTBUILD_REGISTRY_DEADLINE", "soon")
    with pytest.raises(RegistryError, match="ORTBUILD_REGISTRY_DEADLINE='soon' is not a number of seconds"):
        oci.request_deadline()
    monkeypatch.delenv("ORTBUILD_REGISTRY_DEADLINE")
    assert oci.request_deadline() == oci.REQUEST_DEADLINE == 30.0
    assert oci.blob_deadline(64 << 20) == 30.0 + 64  # a second per MiB on top


def test_a_blob_sent_gzip_encoded_is_read_as_sent_not_inflated(tmp_path: Path, serve: Callable[[str], Server],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A registry that gzip-encodes a blob (1 MiB that inflates to 1 GiB): blobs are asked for as stored
    (Accept-Encoding: identity) and read raw, so the bytes counted, written and hashed are the ones sent: the
    digest does not match, nothing inflated lands on disk, and the deadline is not stretched by inflated bytes."""
    gzip_bomb()  # made before the clock starts (the server sends it)
    server = serve("gzip-blob")
    ref = f"oci://{server.where}/r:tag"
    start = time.monotonic()
    code = cli.main(["pull", ref, "--public-key", str(public_key_file(tmp_path)), "--to", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code != 0 and "does not match its digest" in err and "Traceback" not in err, err
    assert time.monotonic() - start < 4 * DEADLINE
    assert all(p.stat().st_size <= len(gzip_bomb()) for p in tmp_path.rglob("*") if p.is_file())


def test_an_oci_cache_entry_whose_manifest_layer_is_huge_is_refused_before_it_is_fetched(
        tmp_path: Path, serve: Callable[[str], Server]) -> None:
    server = serve("cache-bigman")
    c = cache.configured(tmp_path / "targets.toml", "", f"oci://{server.where}/cache", False)
    assert c is not None
    with pytest.raises(Tampered, match=r"layer manifest\.json declares 1073741824 bytes, more than the 4 MiB"):
        c.fetch("0" * 64, tmp_path)
    assert not any("/blobs/" in r for r in server.requests), server.requests
