"""HTTP(S) to a vetted address: the connection goes only where the check said, and still names the host."""

import http.client
import http.server
import ipaddress
import socket
import threading
from urllib.parse import urlsplit

import pytest

from common import pinned


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "::1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "169.254.169.254", "fe80::1%eth0", "fc00::1",
     "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1", "0.0.0.0", "100.64.0.1", "224.0.0.1", "ff02::1",
     "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "64:ff9b::a00:5", "::a00:5", "64:ff9b:1::a00:5", "fec0::1", "::"],
)  # fmt: skip
def test_loopback_private_link_local_shared_and_multicast_addresses_are_not_public(address):
    """NAT64 (64:ff9b::/96, usual on IPv6-only networks) and IPv4-compatible addresses are judged as the
    IPv4 address they carry; the local-use NAT64 prefix and site-local fec0::/10 are never public."""
    assert not pinned.is_public(address)


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"]
)
def test_globally_routable_addresses_are_public_and_ipv4_inside_ipv6_is_judged_as_that_ipv4(address):
    assert pinned.is_public(address)


def test_an_ipv4_carried_in_ipv6_is_compared_as_the_ipv4_itself():
    assert str(pinned.unwrapped("::ffff:10.1.2.3")) == "10.1.2.3"
    assert str(pinned.unwrapped("2002:7f00:1::1")) == "127.0.0.1"
    assert str(pinned.unwrapped("fe80::1%eth0")) == "fe80::1"
    assert str(pinned.unwrapped("64:ff9b::a9fe:a9fe")) == "169.254.169.254"
    assert str(pinned.unwrapped("::a00:5")) == "10.0.0.5"
    assert (
        str(pinned.unwrapped("::1")) == "::1"
    )  # loopback stays IPv6: an operator's "::1/128" still names it


class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers["Host"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def no_dns(monkeypatch):
    """Only address literals may be looked up: the host name in the URL is never resolved again."""
    real = socket.getaddrinfo

    def literals_only(host, *args, **kwargs):
        ipaddress.ip_address(host)  # ValueError for a name
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", literals_only)


def test_the_connection_goes_to_the_checked_address_and_the_host_header_names_the_host(server, no_dns):
    port = server.server_address[1]
    conn, target = pinned.connection(
        urlsplit(f"http://data.example:{port}/a/b?c=1"), port, addresses=["127.0.0.1"], timeout=5
    )
    try:
        conn.request("GET", target)
        assert conn.getresponse().read() == b"ok"
    finally:
        conn.close()
    assert server.seen == [("/a/b?c=1", f"data.example:{port}")]


def test_each_checked_address_is_tried_in_order_until_one_answers(server, no_dns):
    port = server.server_address[1]  # the server listens on 127.0.0.1 only: 127.0.0.2 refuses
    conn, target = pinned.connection(
        urlsplit(f"http://two.example:{port}"), port, addresses=["127.0.0.2", "127.0.0.1"], timeout=5
    )
    try:
        conn.request("GET", target)
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    assert server.seen == [("/", f"two.example:{port}")]


def test_with_no_checked_address_nothing_is_connected():
    with pytest.raises(OSError, match="no address"):
        pinned.connect_any([], 80, 1)


def test_tls_is_verified_for_the_host_name_not_the_address(server, no_dns):
    port = server.server_address[1]
    conn, _ = pinned.connection(
        urlsplit(f"https://data.example:{port}/"), port, addresses=["127.0.0.1"], timeout=5
    )
    assert isinstance(conn, pinned.PinnedHTTPSConnection)
    assert conn._context.verify_mode.name == "CERT_REQUIRED" and conn._context.check_hostname
    wrapped = []

    class _Context:
        def wrap_socket(self, sock, *, server_hostname):
            wrapped.append((sock.getpeername()[0], server_hostname))
            return sock

    conn._context = _Context()
    conn.connect()
    conn.close()
    assert wrapped == [("127.0.0.1", "data.example")]


def test_a_caller_may_read_answers_with_its_own_response_class(server, no_dns):
    class _Marked(http.client.HTTPResponse):
        pass

    port = server.server_address[1]
    conn, target = pinned.connection(
        urlsplit(f"http://data.example:{port}/"),
        port,
        addresses=["127.0.0.1"],
        timeout=5,
        response_class=_Marked,
    )
    try:
        conn.request("GET", target)
        assert isinstance(conn.getresponse(), _Marked)
    finally:
        conn.close()
