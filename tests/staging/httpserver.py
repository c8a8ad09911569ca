"""A local HTTP server for the staging tests and bench: Range and If-Range, HEAD, and ways to fail.

Threaded ``http.server`` on 127.0.0.1 serving files from a folder with ``sendfile``. Modes: drop
the connection after N bytes of a file's next GET, or go silent there first; answer the next
requests with given statuses; ignore Range; refuse HEAD; redirect a path elsewhere. It counts the
body bytes it sent (also at ``/_stats``, for the bench, which runs it in its own process so it
shares no GIL with the stager).
"""

import email.utils
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


@dataclass
class DataServer:
    root: Path
    bytes_sent: int = 0
    requests: list[dict] = field(default_factory=list)
    drop_after: dict[str, int] = field(default_factory=dict)  # name -> bytes sent before the drop (once)
    stall_after: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (bytes, seconds) (once)
    # name -> (bytes, pause, seconds): every answer sends that many bytes, pauses, again, then hangs up
    trickle: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    fail_next: dict[str, list[int]] = field(default_factory=dict)  # name -> statuses answered first
    redirects: dict[str, str] = field(default_factory=dict)  # name -> Location
    ignore_range: bool = False
    head_allowed: bool = True

    def start(self) -> "DataServer":
        self.root.mkdir(parents=True, exist_ok=True)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.data = self
        self._lock = threading.Lock()
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{name}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def gets(self, name: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and r["path"] == name]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        if not self.server.data.head_allowed:
            self._status(405)
            return
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        data: DataServer = self.server.data
        name = unquote(self.path.split("?", 1)[0]).lstrip("/")  # as any server: %C3%A9 names "é"
        if name == "_stats":  # for a server in another process (the bench): what it has sent
            self._stats(data)
            return
        data.requests.append({"method": self.command, "path": name, "range": self.headers.get("Range"),
                              "if_range": self.headers.get("If-Range"), "host": self.headers.get("Host")})  # fmt: skip
        if data.fail_next.get(name):
            self._status(data.fail_next[name].pop(0))
            return
        if name in data.redirects:
            self._status(302, location=data.redirects[name])
            return
        path = data.root / name
        if not name or not path.is_file():
            self._status(404)
            return
        self._send_file(data, name, path, body=body)

    def _send_file(self, data: DataServer, name: str, path: Path, *, body: bool) -> None:
        st = path.stat()
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        start = self._range_start(etag, data)
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(st.st_size - start))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{st.st_size - 1}/{st.st_size}")
        self.end_headers()
        if not body:
            return
        if name in data.trickle:
            self._trickle(path, start, *data.trickle[name])
            return
        drop = data.drop_after.pop(name, None)
        stall = data.stall_after.pop(name, None)
        if stall is not None:  # go quiet mid-body, then hang up: the reader must give up by itself
            drop = stall[0]
        count = st.st_size - start if drop is None else min(drop, st.st_size - start)
        with path.open("rb") as handle:
            sent = self.connection.sendfile(handle, offset=start, count=count) if count else 0
        with data._lock:
            data.bytes_sent += sent
        if stall is not None:
            time.sleep(stall[1])
        if drop is not None:  # hang up mid-body, as a flaky network would
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _trickle(self, path: Path, start: int, size: int, pause: float, seconds: float) -> None:
        """A source that never stalls long enough to time out, yet would take days: then hangs up."""
        deadline = time.monotonic() + seconds
        with path.open("rb") as handle:
            handle.seek(start)
            while time.monotonic() < deadline and (chunk := handle.read(size)):
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(pause)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _range_start(self, etag: str, data: DataServer) -> int:
        wanted = self.headers.get("Range", "")
        if_range = self.headers.get("If-Range")
        if data.ignore_range or not wanted.startswith("bytes=") or (if_range and if_range != etag):
            return 0
        return int(wanted.removeprefix("bytes=").split("-", 1)[0] or 0)

    def _stats(self, data: DataServer) -> None:
        body = json.dumps({"bytes_sent": data.bytes_sent, "requests": len(data.requests)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, status: int, *, location: str = "") -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main() -> None:
    """``python -m tests.staging.httpserver ROOT``: serves ROOT in its own process, prints the port."""
    server = DataServer(Path(sys.argv[1])).start()
    print(server.port, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
