"""The egress proxy an outside registry's pull goes through, over real sockets: what it refuses, what it relays."""

import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from jobs import transfers
from jobs.transfers import egress, registry

REFUSED = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.fixture
def echo():
    """A server on 127.0.0.1 sending back whatever each connection sends it: its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dial(proxy: egress.Proxy) -> socket.socket:
    parts = urlsplit(proxy.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    return sock


def answer(sock: socket.socket) -> bytes:
    """What the proxy sends back until its blank line (or until it closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def ask(proxy: egress.Proxy, head: bytes) -> bytes:
    with dial(proxy) as sock:
        sock.sendall(head)
        return answer(sock)


def connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def test_a_name_that_resolves_to_loopback_is_refused_and_the_reason_kept():
    with egress.Proxy(ports={443}, allow_private=False) as proxy:
        assert ask(proxy, connect("localhost:443")) == REFUSED
    (problem,) = proxy.problems
    assert isinstance(problem, transfers.TransferFailed)
    assert (
        "localhost:443" in str(problem) and "127.0.0.1" in str(problem) and "private address" in str(problem)
    )
    assert proxy.tunnels == []


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("10.0.0.5:443", "private address: refused"),
        ("169.254.169.254:443", "metadata service: refused"),
        ("[::ffff:169.254.169.254]:443", "metadata service: refused"),
    ],
)
def test_a_private_or_metadata_address_is_refused_naming_it(target, why):
    with egress.Proxy(ports={443}, allow_private=False) as proxy:
        assert ask(proxy, connect(target)) == REFUSED
    assert why in str(proxy.problems[0])
    assert target.rpartition(":")[0].strip("[]") in str(proxy.problems[0])


def test_a_refusal_tells_an_open_port_from_a_closed_one_in_nothing(echo):
    """Before a connection is tried the target is judged: skopeo's error can no longer map the node's ports."""
    shut = closed_port()
    with egress.Proxy(ports={echo, shut}, allow_private=False) as proxy:
        to_open = ask(proxy, connect(f"127.0.0.1:{echo}"))
        to_closed = ask(proxy, connect(f"127.0.0.1:{shut}"))
    assert to_open == to_closed == REFUSED


def test_a_plain_http_request_is_refused_whatever_its_target(echo):
    """Go sends http:// through HTTP_PROXY as an absolute-form GET: outside registries are TLS only."""
    with egress.Proxy(ports={80, echo}, allow_private=True) as proxy:
        assert (
            ask(proxy, b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n") == REFUSED
        )
        assert ask(proxy, f"GET http://127.0.0.1:{echo}/ HTTP/1.1\r\n\r\n".encode()) == REFUSED
    assert len(proxy.problems) == 2 and proxy.tunnels == []
    assert "plain HTTP" in str(proxy.problems[0]) and "169.254.169.254" in str(proxy.problems[0])


def test_a_port_other_than_443_or_the_registrys_own_is_refused(echo):
    with egress.Proxy(ports={443}, allow_private=True) as proxy:
        assert ask(proxy, connect(f"127.0.0.1:{echo}")) == REFUSED
    assert f"port {echo}" in str(proxy.problems[0]) and proxy.tunnels == []


@pytest.mark.parametrize(
    "head",
    [b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"CONNECT http://x:443/ HTTP/1.1\r\n\r\n", b"nonsense\r\n\r\n",
     b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n", b"CONNECT user@127.0.0.1:443 HTTP/1.1\r\n\r\n"],
)  # fmt: skip
def test_a_malformed_request_is_refused(head):
    with egress.Proxy(ports={443}, allow_private=True) as proxy:
        assert ask(proxy, head) == REFUSED
    assert proxy.problems and proxy.tunnels == []


def test_an_allowed_target_is_relayed_both_ways(echo):
    payload = bytes(range(256)) * 4096  # 1 MiB, more than one relay buffer
    with egress.Proxy(ports={echo}, allow_private=True) as proxy, dial(proxy) as sock:
        sock.sendall(connect(f"127.0.0.1:{echo}"))
        assert answer(sock) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        back = b""
        while len(back) < len(payload):
            back += sock.recv(65536)
        sender.join()
        assert back == payload
    assert proxy.tunnels == [f"127.0.0.1:{echo}"] and proxy.problems == []


def test_an_unreachable_target_is_a_bad_gateway_worth_retrying():
    shut = closed_port()
    with egress.Proxy(ports={shut}, allow_private=True) as proxy:
        assert ask(proxy, connect(f"127.0.0.1:{shut}")).startswith(b"HTTP/1.1 502 ")
    assert isinstance(proxy.problems[0], transfers.Transient)


def test_no_more_than_the_bound_of_connections_at_once(echo):
    with egress.Proxy(ports={echo}, allow_private=True, max_connections=2) as proxy:
        held = [dial(proxy) for _ in range(2)]
        for sock in held:
            sock.sendall(connect(f"127.0.0.1:{echo}"))
            assert answer(sock).startswith(b"HTTP/1.1 200 ")
        assert ask(proxy, connect(f"127.0.0.1:{echo}")) == REFUSED
        assert "more than 2 connections" in str(proxy.problems[0])
        held.pop().close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not ask(proxy, connect(f"127.0.0.1:{echo}")).startswith(
            b"HTTP/1.1 200"
        ):
            time.sleep(0.05)  # the closed tunnel's slot frees once its relay notices
        assert time.monotonic() < deadline, "a closed tunnel never gave its slot back"
        held[0].close()


def test_a_request_head_that_never_ends_times_out():
    with egress.Proxy(ports={443}, allow_private=True, head_timeout_s=0.3) as proxy, dial(proxy) as sock:
        sock.sendall(b"CONNECT 127.0.0.1:4")  # and nothing more
        began = time.monotonic()
        assert answer(sock) == REFUSED
        assert time.monotonic() - began < 3
    assert "request head" in str(proxy.problems[0])


def test_a_request_head_over_the_bound_is_refused():
    head = b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nX-Padding: " + b"a" * egress.HEAD_LIMIT  # and no blank line
    with egress.Proxy(ports={443}, allow_private=True) as proxy:
        assert ask(proxy, head[: egress.HEAD_LIMIT + 4]) == REFUSED
    assert "request head over" in str(proxy.problems[0]) and proxy.tunnels == []


def test_leaving_the_proxy_closes_its_tunnels_and_stops_listening(echo):
    with egress.Proxy(ports={echo}, allow_private=True) as proxy:
        sock = dial(proxy)
        sock.sendall(connect(f"127.0.0.1:{echo}"))
        assert answer(sock).startswith(b"HTTP/1.1 200 ")
    with sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""
    with pytest.raises(ConnectionRefusedError):
        dial(proxy)


def test_skopeo_is_sent_through_the_proxy_for_https_and_http_alike():
    with egress.Proxy(ports={443}, allow_private=False) as proxy:
        env = proxy.environment()
    assert env == {"HTTPS_PROXY": proxy.url, "HTTP_PROXY": proxy.url, "NO_PROXY": ""}
    assert urlsplit(proxy.url).hostname == "127.0.0.1"


def test_a_refusal_for_good_is_the_failure_even_after_one_worth_retrying():
    """From the review: the first refusal was the pull's failure, so a connection refused for being one too many
    (worth retrying) hid that the registry pointed at a private address (never worth retrying)."""
    refusals = [
        transfers.Transient("too many connections at once"),
        transfers.TransferFailed("a private address"),
    ]
    failure = registry._failure("Forbidden", refusals, registry.Access())
    assert isinstance(failure, transfers.TransferFailed) and str(failure) == "a private address"
