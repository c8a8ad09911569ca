"""A client that stops reading its answer, or sending its request, holds a web thread only so long.

gunicorn blocks on a client's socket with no deadline: a download whose client never read (a 4 KB receive buffer,
nothing taken from it) held its thread, and the sending place its download took (``common.export``), for as long
as the socket stayed open, so every other download of its team was answered 429 meanwhile. Each request's socket
gets E31_CLIENT_STALL_S for every read and every write gunicorn makes instead: past it gunicorn drops the connection
and closes the response, which gives its place back. A deadline per piece, not per answer: one write sends one
piece whole (a log download's are 256 KB, an export's 64 KB, a file's 4 KB), so at the 60 s default a download is
cut only when its client reads below about 4.4 KB/s, 1.1 KB/s and 70 bytes/s.
"""

from django.conf import settings


class ClientStallMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        client = request.META.get("gunicorn.socket")  # absent under other servers and in tests' clients
        if client is not None:
            client.settimeout(settings.E31_CLIENT_STALL_S)
        return self.get_response(request)
