"""A local webhook receiver: records each request and answers with the statuses it is given."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses=(200,), host: str = "127.0.0.1") -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[str, dict, bytes]] = []
        self.answer: bytes | None = None  # the body of every answer, where a test sets one
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests.append((self.path, dict(self.headers.items()), body))
                status = owner.statuses.pop(0) if len(owner.statuses) > 1 else owner.statuses[0]
                self.send_response(status)
                self.end_headers()
                default = b"thanks" if status < 300 else b"receiver broke"
                self.wfile.write(default if owner.answer is None else owner.answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hooks/e31"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
