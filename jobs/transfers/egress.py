"""The egress proxy an outside registry's pull goes through: every connection skopeo makes, pinned to checked addresses.

skopeo resolves the registry's name itself and follows the redirects and bearer-token realms the registry names,
so a second DNS answer (rebinding) or a hostile registry could send the staging node to a loopback, private or
metadata address (169.254.169.254). Given HTTPS_PROXY and HTTP_PROXY, Go sends each of those connections here as a
``CONNECT host:port``: the host is resolved once and judged as a data source's is (``sources.checked_addresses``),
and only a checked address is connected to. Whatever is refused gets one and the same 403 before anything is
connected, so skopeo's errors no longer tell an open port from a closed one; the reason is kept (``problems``) for
the staging failure to name. Go never proxies "localhost" or a loopback IP literal, whatever the environment says:
those still go straight from skopeo (README, E31_OUTSIDE_REGISTRIES).
"""

import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Collection
from urllib.parse import urlsplit

from common import pinned
from jobs import transfers
from jobs.transfers import sources

HEAD_LIMIT = 8 * 1024
MAX_CONNECTIONS = 16  # skopeo pulls at most 6 layers at once, besides its manifest and token requests
RELAY_BUFFER = 64 * 1024
REFUSED = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
UNREACHABLE = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
LINGER_S = 0.5
WHO = "the registry, or a redirect or token realm it named"


class _Turned(Exception):
    """A request not relayed: ``answer`` goes back to skopeo, ``problem`` is what the staging failure says."""

    def __init__(self, answer: bytes, problem: Exception) -> None:
        super().__init__(str(problem))
        self.answer, self.problem = answer, problem


def _refused(problem: Exception) -> _Turned:
    return _Turned(REFUSED, problem)


class Proxy:
    """A CONNECT proxy on 127.0.0.1, for the length of one skopeo call: ``with Proxy(...) as proxy:``.

    ``ports``: the ports a connection may name (443, and the one the registry's reference names);
    ``allow_private``: the operator's E31_ALLOW_PRIVATE_SOURCES; ``timeout_s``: for each connect, and for a
    tunnel in which neither side sends anything; ``head_timeout_s``: for a request head, however it is paced.
    """

    def __init__(
        self, *, ports: Collection[int], allow_private: bool, timeout_s: float = 30.0,
        head_timeout_s: float = 10.0, max_connections: int = MAX_CONNECTIONS,
    ) -> None:  # fmt: skip
        self.ports, self.allow_private = frozenset(ports), allow_private
        self.timeout_s, self.head_timeout_s, self.max_connections = timeout_s, head_timeout_s, max_connections
        self.problems: list[Exception] = []  # what it refused or could not reach, in order (append is atomic)
        self.tunnels: list[str] = []  # every host:port it relayed
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closing = False

    def __enter__(self) -> "Proxy":
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc) -> None:
        """Stops listening and ends every tunnel, so nothing skopeo opened outlives its call."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._closing = True
            for sock in self._open:
                _shut(sock)

    def environment(self) -> dict[str, str]:
        """What sends every request skopeo makes here (Go's http.ProxyFromEnvironment), https and http alike."""
        return {"HTTPS_PROXY": self.url, "HTTP_PROXY": self.url, "NO_PROXY": ""}

    def serve(self, client: socket.socket) -> None:
        """One connection: its CONNECT judged, then relayed to a checked address, or answered and closed."""
        if not self._track(client):
            return
        try:
            self._tunnel(client)
        except _Turned as turned:
            self.problems.append(turned.problem)
            _answer(client, turned.answer)
        finally:
            self._untrack(client)

    def refuse_over_bound(self, client: socket.socket) -> None:
        """A connection past ``max_connections``: answered in the accepting thread (LINGER_S at most), no thread
        started for it."""
        self.problems.append(
            transfers.Transient(f"skopeo opened more than {self.max_connections} connections at once")
        )
        _answer(client, REFUSED)

    def _tunnel(self, client: socket.socket) -> None:
        head, early = _read_head(client, self.head_timeout_s)
        if head is None:
            return  # closed before it asked for anything: nothing to refuse
        host, port = self._target(head)
        with self._connect(host, port) as upstream:
            if not self._track(upstream):
                return
            try:
                client.sendall(ESTABLISHED)
                upstream.sendall(early)
                _relay(client, upstream, self.timeout_s)
            finally:
                self._untrack(upstream)

    def _target(self, head: bytes) -> tuple[str, int]:
        """The host and port of a ``CONNECT host:port HTTP/1.x`` to an allowed port; refused otherwise."""
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, _, rest = line.partition(" ")
        target, _, version = rest.partition(" ")
        if method != "CONNECT" and target.startswith("http://"):
            raise _refused(transfers.TransferFailed(
                f"a plain HTTP request to {target[:200]} ({WHO}): refused (an outside registry is reached over "
                "verified TLS only)"
            ))  # fmt: skip
        authority = _authority(target)
        if method != "CONNECT" or not version.startswith("HTTP/1.") or authority is None:
            raise _refused(
                transfers.TransferFailed(f"a request the egress proxy does not take: {line[:200]!r}")
            )
        host, port = authority
        if port not in self.ports:
            raise _refused(transfers.TransferFailed(
                f"a connection to {_shown(host, port)} ({WHO}): port {port} refused (an outside registry is "
                "reached on port 443, or on the port its reference names)"
            ))  # fmt: skip
        return host, port

    def _connect(self, host: str, port: int) -> socket.socket:
        """A connection to one of the host's checked addresses: the name is resolved here once, and only here."""
        try:
            addresses = sources.checked_addresses(host, port, allow_private=self.allow_private)
        except (transfers.TransferFailed, transfers.Transient) as exc:
            raise _refused(type(exc)(f"a connection to {_shown(host, port)} ({WHO}): {exc}")) from exc
        try:
            upstream = pinned.connect_any(addresses, port, self.timeout_s)
        except OSError as exc:  # a checked address only: what it tells of its ports, a direct pull would tell
            raise _Turned(
                UNREACHABLE, transfers.Transient(f"{_shown(host, port)} ({WHO}): {exc.strerror or exc}")
            ) from exc
        self.tunnels.append(_shown(host, port))
        return upstream

    def _track(self, sock: socket.socket) -> bool:
        """Keeps ``sock`` to shut when the proxy closes; False (and shut) if it is closing already."""
        with self._lock:
            if self._closing:
                _shut(sock)
                return False
            self._open.add(sock)
            return True

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, at most ``max_connections`` at once; the rest refused, never queued."""

    daemon_threads = True
    block_on_close = False  # __exit__ shuts every tunnel; a connect or a lookup under way ends by its timeout

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request, client_address) -> None:
        if not self.proxy._slots.acquire(blocking=False):
            self.proxy.refuse_over_bound(request)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.proxy._slots.release()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            self.server.proxy.serve(self.request)
        except OSError:
            pass  # either side went away: the tunnel ends, as it would on a close


def _read_head(client: socket.socket, timeout_s: float) -> tuple[bytes | None, bytes]:
    """(the request head up to its blank line, what came after it): at most HEAD_LIMIT bytes, within
    ``timeout_s`` however they are paced; (None, b"") if the client closes first."""
    deadline, data = time.monotonic() + timeout_s, b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_LIMIT:
            raise _refused(transfers.TransferFailed(f"a request head over {HEAD_LIMIT} bytes: refused"))
        try:
            client.settimeout(pinned.time_left(deadline, timeout_s))
            chunk = client.recv(HEAD_LIMIT + 4 - len(data))
        except TimeoutError as exc:
            raise _refused(
                transfers.Transient(f"a request head not ended within {timeout_s:g} s: refused")
            ) from exc
        if not chunk:
            return None, b""
        data += chunk
    head, _, early = data.partition(b"\r\n\r\n")
    return head, early


def _authority(target: str) -> tuple[str, int] | None:
    """(host, port) of a CONNECT's ``host:port`` (an IPv6 address in brackets); None for anything else."""
    try:
        parts = urlsplit("//" + target)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port out of range or not a number, a broken "["
        return None
    if not host or not port or parts.netloc != target or "@" in target:
        return None
    return host, port


def _relay(one: socket.socket, other: socket.socket, idle_s: float) -> None:
    """Bytes both ways until either side closes, or neither sends anything for ``idle_s``."""
    peers = {one: other, other: one}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            sock.settimeout(idle_s)  # a peer that stops reading cannot hold a sendall for ever either
            selector.register(sock, selectors.EVENT_READ)
        while ready := selector.select(idle_s):
            for key, _ in ready:
                data = key.fileobj.recv(RELAY_BUFFER)
                if not data:
                    return
                peers[key.fileobj].sendall(data)


def _answer(client: socket.socket, answer: bytes) -> None:
    """Sends ``answer`` and reads on until the client closes, for LINGER_S at most: closed with bytes of its request
    still unread, the socket would send a reset that may reach the client before the answer does."""
    try:
        client.settimeout(LINGER_S)
        client.sendall(answer)
        client.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + LINGER_S
        while client.recv(HEAD_LIMIT) and time.monotonic() < deadline:
            pass
    except OSError:
        pass


def _shut(sock: socket.socket) -> None:
    """Wakes whatever waits on ``sock`` (a recv, a select): it reads the end of the stream."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
