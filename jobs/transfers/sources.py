"""Where bytes come from: file://, http(s)://, s3://, the address and root checks, and their readers.

Two sources do not go through fsspec, for safety: file:// is opened with O_NOFOLLOW|O_NONBLOCK
and judged by fstat on the very descriptor it reads (fsspec's local open() follows a swapped-in
link and blocks on a FIFO); http(s) uses ``http.client``, because the stager must connect to the
very address it checked (no second DNS answer), send Range/If-Range to resume, and tell 206 from
200, which fsspec's aiohttp backend hides. s3:// goes through fsspec, with s3fs imported only
when used.
"""

import errno
import http.client
import io
import os
import re
import socket
import stat
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import SplitResult, quote, unquote, urljoin, urlsplit

import fsspec

from common import pinned, platform_services
from jobs import declaration, transfers

# --------------------------------------------------------------------------- readers


class _FdReader:
    """A local file read from a given offset; the kernel copies it (copy_file_range) when it can."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset = fd, offset
        os.lseek(fd, offset, os.SEEK_SET)
        self._kernel = True
        self._buf: memoryview | None = None

    def pump(self, out: int, want: int) -> int:
        """Moves up to ``want`` bytes straight into ``out``."""
        if self._kernel:
            try:
                return os.copy_file_range(self.fd, out, want)
            except OSError as exc:  # another filesystem or an old kernel: copy through a buffer
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self._kernel = False
        if self._buf is None:
            self._buf = memoryview(bytearray(transfers.BUFFER))
        n = self.readinto(self._buf[: min(want, transfers.BUFFER)])
        write_all(out, self._buf[:n])
        return n

    def readinto(self, buf: memoryview) -> int:
        return os.readv(self.fd, [buf])

    def close(self) -> None:
        pass


class _StreamReader:
    """Anything with ``readinto`` (an HTTP response, an fsspec file), through one reused buffer."""

    def __init__(self, stream, offset: int, closer: Callable[[], None] | None = None) -> None:
        self.stream, self.offset = stream, offset
        self._closer = closer or stream.close
        self._buf = memoryview(bytearray(transfers.BUFFER))

    def pump(self, out: int, want: int) -> int:
        n = self.readinto(self._buf[: min(want, transfers.BUFFER)])
        write_all(out, self._buf[:n])
        return n

    def readinto(self, buf: memoryview) -> int:
        n = self.stream.readinto(buf) or 0
        if n == 0 and getattr(self.stream, "length", None):
            # http.client's readinto returns 0, not an error, when the peer hangs up early
            raise transfers.Transient(f"the connection closed with {self.stream.length} bytes still to come")
        return n

    def close(self) -> None:
        self._closer()


def write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


# --------------------------------------------------------------------------- sources


class LocalSource:
    """A trusted local file (a sealed output on its node): no root checks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None

    def probe(self) -> transfers.SourceInfo:
        self._file = self._file or open(self.path, "rb", buffering=0)
        st = os.fstat(self._file.fileno())
        return transfers.SourceInfo(st.st_size, f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}")

    def open(self, offset: int) -> _FdReader:
        self.probe()
        return _FdReader(self._file.fileno(), offset)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class FileSource(LocalSource):
    """A file:// source: must be, once opened, a regular file under the data roots with one link."""

    def __init__(self, uri: str, *, roots: Sequence[Path], allow_hardlinks: bool) -> None:
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise transfers.TransferFailed("a file URI is file:///absolute/path")
        super().__init__(Path(unquote(parts.path)))
        self.roots, self.allow_hardlinks = roots, allow_hardlinks

    def probe(self) -> transfers.SourceInfo:
        if self._file is None:
            real = Path(os.path.realpath(self.path))
            if not _under(real, self.roots):
                raise transfers.TransferFailed(
                    "the file is not under an allowed data root (after resolving .. and links)"
                )
            # O_NOFOLLOW: a link swapped in since realpath is refused; O_NONBLOCK: a FIFO cannot hang us.
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                raise transfers.TransferFailed(f"cannot open the file: {exc.strerror or exc}") from exc
            try:
                self._check_opened(fd)
            except BaseException:
                os.close(fd)
                raise
            os.set_blocking(fd, True)
            self._file = os.fdopen(fd, "rb", buffering=0)
        return super().probe()

    def _check_opened(self, fd: int) -> None:
        """Checks the file actually opened, so a link swapped in after the path check cannot escape."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise transfers.TransferFailed("not a regular file")
        if st.st_nlink > 1 and not self.allow_hardlinks:
            raise transfers.TransferFailed(
                f"the file has {st.st_nlink} hard links; another may lie outside the data roots, "
                "so it is refused (an operator may allow hard-linked sources)"
            )
        opened = _opened_path(fd)
        if opened is not None and not _under(opened, self.roots):
            raise transfers.TransferFailed("the opened file is not under an allowed data root")


def _opened_path(fd: int) -> Path | None:
    """The kernel's own name for an open file (Linux /proc), or None where there is no /proc."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


class HttpSource:
    """An http(s) source, fetched from the very address that passed the check, resumable by Range."""

    def __init__(self, url: str, *, allow_private: bool, timeout: float) -> None:
        self.url, self.allow_private, self.timeout = url, allow_private, timeout
        self.validator = ""

    def probe(self) -> transfers.SourceInfo:
        resp, conn = self._request("HEAD", {})
        conn.close()
        if resp.status in (405, 501):  # HEAD not offered: learn nothing, the GET still checks the size
            return transfers.SourceInfo(None, "")
        _raise_for_status(resp.status)
        length = resp.getheader("Content-Length")
        self.validator = _validator(resp)
        return transfers.SourceInfo(
            int(length) if length and re.fullmatch(r"[0-9]+", length) else None, self.validator
        )

    def open(self, offset: int) -> _StreamReader:
        if not self.validator:
            offset = 0  # nothing tells a changed file from the one begun: a resume could splice two versions
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        if offset:
            headers["If-Range"] = self.validator  # a changed file comes back whole (200), never spliced
        resp, conn = self._request("GET", headers)
        if resp.status == 206 and offset:
            start = _range_start(resp.getheader("Content-Range", ""))
            if start != offset:
                conn.close()
                raise transfers.TransferFailed(f"the server resumed at byte {start}, not {offset}")
            _blocking_with_timeout(resp.sock, self.timeout)
            return _StreamReader(resp, offset, _closing(resp, conn))
        _raise_for_status(resp.status)
        # 200: the whole body again, from byte 0, and the version a later resume must still find (a
        # server that refuses HEAD names it only here).
        self.validator = _validator(resp)
        _blocking_with_timeout(resp.sock, self.timeout)
        return _StreamReader(resp, 0, _closing(resp, conn))

    def close(self) -> None:
        pass

    def _request(self, method: str, headers: dict[str, str]):
        url = self.url
        for _ in range(transfers.MAX_REDIRECTS + 1):
            conn, target = self._connect(url)
            conn.request(
                method,
                target,
                headers={"User-Agent": transfers.USER_AGENT, "Accept-Encoding": "identity", **headers},
            )
            resp = conn.getresponse()
            location = resp.getheader("Location")
            if resp.status not in (301, 302, 303, 307, 308) or not location:
                return resp, conn
            conn.close()
            url = _redirected(url, location)  # every hop is checked again by _connect
        raise transfers.TransferFailed(f"more than {transfers.MAX_REDIRECTS} redirects")

    def _connect(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        parts, port = _target(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise transfers.TransferFailed(
                f"refused a redirect to {parts.scheme or 'a relative'}:// (only http and https)"
            )
        addresses = checked_addresses(parts.hostname, port, allow_private=self.allow_private)
        conn, target = pinned.connection(
            parts, port, addresses=addresses, timeout=self.timeout, response_class=_Response
        )
        return conn, _percent_encoded(target)


def _closing(resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> Callable[[], None]:
    def close() -> None:
        resp.close()  # an answer that closes its connection holds the socket itself
        conn.close()

    return close


def _validator(resp: http.client.HTTPResponse) -> str:
    """What names this version of the body: a strong ETag, else Last-Modified, else ""."""
    etag = resp.getheader("ETag", "")
    return etag if etag and not etag.startswith("W/") else resp.getheader("Last-Modified", "")


def _target(url: str) -> tuple[SplitResult, int]:
    """The URL's parts and port. A broken "[" host, ":99999" or ":abc" (stored before intake checked for
    them, or sent in a redirect) fails the transfer: its ValueError would stop the stager mid-job."""
    try:
        parts = urlsplit(url)
        return parts, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise transfers.TransferFailed(f"not a valid URL: {exc}") from exc


def _percent_encoded(target: str) -> str:
    """The request target as a browser sends it: a name outside ASCII, or with a space, percent-encoded (UTF-8);
    what is encoded already is kept. http.client refuses both raw (UnicodeEncodeError, "control characters")."""
    return quote(target, safe="/%:@!$&'()*+,;=?~")


def _redirected(url: str, location: str) -> str:
    try:
        return urljoin(url, location)
    except ValueError as exc:  # a Location with a broken "[" host
        raise transfers.TransferFailed(f"the server redirected to an invalid URL: {exc}") from exc


class _Response(http.client.HTTPResponse):
    """A response whose every read call ends within a time limit (the transfer's per-read timeout), however the
    server paces its bytes: the status line and headers together, then each body read.

    A per-read timeout alone let a server sending one byte of a header or chunk-size line now and then hold the
    stager, its transfer slot and the job for as long as it liked (a 65,536-byte line at 30 s a byte is 22 days):
    http.client reads a line in as many reads as it takes, and the pool's rate floor is checked only between
    body reads. A body read hands back what one recv gave, as curl does, instead of looping until the buffer
    is full: the write then overlaps the sender's next bytes (measured 1.5x here), and the floor sees each one.
    """

    def __init__(self, sock: socket.socket, *args, **kwargs) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # nothing read yet: the socket stays open for the reader below
        self._reads = _TimedReads(sock, limit_s=sock.gettimeout())
        self.fp = io.BufferedReader(self._reads)

    @property
    def sock(self) -> socket.socket:
        """Its socket: an answer that closes its connection (HTTP/1.0, ``Connection: close``, no length) has
        it, as http.client hands it over and forgets it on the connection."""
        return self._reads.sock

    def readinto(self, b) -> int:
        self._reads.restart()
        if self.fp is None:
            return 0
        if self.chunked:  # at most one chunk's piece (and its size line), not as many chunks as fill ``b``
            left = self._get_chunk_left()  # reads the size line; None once the last chunk is done
            if left is None:
                return 0
            n = self.fp.readinto1(memoryview(b)[: min(len(b), left)])
            if not n:
                raise http.client.IncompleteRead(b"")
            self.chunk_left = left - n
            return n
        if self.length is None:  # read until the server closes
            n = self.fp.readinto1(b)
        else:
            n = self.fp.readinto1(memoryview(b)[: self.length]) if self.length else 0
        if not n:
            self._close_conn()  # ``length`` left above 0 tells the reader the peer hung up early
            return 0
        if self.length is not None:
            self.length -= n
            if not self.length:
                self._close_conn()
        return n


class _TimedReads(io.RawIOBase):
    """A socket's reads for one response, refused once the current read call has run past its time limit."""

    def __init__(self, sock: socket.socket, *, limit_s: float | None) -> None:
        super().__init__()
        self.sock, self._raw, self.limit_s = sock, sock.makefile("rb", buffering=0), limit_s
        self.restart()

    def restart(self) -> None:
        self._deadline = None if self.limit_s is None else time.monotonic() + self.limit_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise TimeoutError(f"timed out: the server sent too little in {self.limit_s:g} s")
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _blocking_with_timeout(sock: socket.socket, timeout: float) -> None:
    """Reads the body in blocking mode, with the stall limit in the kernel (SO_RCVTIMEO).

    A Python socket timeout polls before every recv; on loopback that measured 2-4x slower than
    curl here. A stalled read still ends, as an OSError (EAGAIN) the copy loop retries.
    """
    sock.settimeout(None)
    seconds = max(timeout, 0.001)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    )


def _raise_for_status(status: int) -> None:
    if status in (200, 206):
        return
    if status >= 500 or status in (408, 425, 429):
        raise transfers.Transient(f"HTTP {status}")
    raise transfers.TransferFailed(f"HTTP {status}" + (": not found" if status in (404, 410) else ""))


def _range_start(content_range: str) -> int:
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return -1


def checked_addresses(host: str, port: int, *, allow_private: bool) -> list[str]:
    """The addresses to connect to: every one the name has must be public unless private ones are allowed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise transfers.TransferFailed(f"{host}: no such host") from exc
        raise transfers.Transient(f"{host}: {exc}") from exc
    except ValueError as exc:
        # UnicodeError (a label empty or over 63 characters) or a NUL byte: no resolver will ever take
        # the name, and an error the stager does not expect would leave the job in STAGING for ever.
        raise transfers.TransferFailed(f"invalid host name {host[:80]!r}: {exc}") from exc
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    for address in addresses:
        if platform_services.is_metadata(address):
            raise transfers.TransferFailed(f"{host} resolves to {address}, a cloud metadata service: refused")
        if platform_services.is_unspecified(address):  # 0.0.0.0 and :: reach this host itself
            raise transfers.TransferFailed(f"{host} resolves to {address}, this host's own: refused")
        if not allow_private and not pinned.is_public(address):
            raise transfers.TransferFailed(
                f"{host} resolves to {address}, a loopback, link-local or private address: "
                "refused (an operator may allow private sources)"
            )
    if _platform_service(addresses, port):
        raise transfers.TransferFailed(f"{host}:{port} is a service of this platform: refused")
    return addresses


def _platform_service(addresses: list[str], port: int) -> bool:
    """Whether one of ``addresses`` on ``port`` is the database, the broker, the cache or the mail server. A
    platform host that does not resolve now is a Transient: it cannot be told apart, and it is tried again."""
    try:
        platform = platform_services.cached()
    except platform_services.Unresolved as exc:
        raise transfers.Transient(str(exc)) from exc
    return any(platform.refuses(address, port) for address in addresses)


class FsspecSource:
    """An s3:// (or other fsspec) source; the optional extra is imported only when one is used."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs = filesystem_for(uri)

    def probe(self) -> transfers.SourceInfo:
        try:
            info = self.fs.info(self.uri)
        except (FileNotFoundError, PermissionError) as exc:
            raise transfers.TransferFailed(f"cannot read {self.uri}: {exc}") from exc
        return transfers.SourceInfo(info.get("size"), str(info.get("ETag") or info.get("mtime") or ""))

    def open(self, offset: int) -> _StreamReader:
        handle = self.fs.open(self.uri, "rb", block_size=transfers.CHUNK)
        handle.seek(offset)
        return _StreamReader(handle, offset)

    def close(self) -> None:
        pass


def filesystem_for(uri: str):
    """fsspec's filesystem for an s3:// URI; a clear refusal when the optional s3 extra is missing."""
    scheme = urlsplit(uri).scheme
    if scheme == "s3":
        try:
            import s3fs  # noqa: F401 - only to learn whether the extra is installed
        except ImportError as exc:
            raise transfers.TransferFailed(
                "s3:// needs the optional 's3' extra (s3fs), which is not installed on this pool"
            ) from exc
    return fsspec.filesystem(scheme)


def open_source(
    uri: str, *, roots: Sequence[Path], s3_prefixes: Sequence[str], allow_private: bool,
    allow_hardlinks: bool, timeout: float,
):  # fmt: skip
    """The source object for a declared input URI (file://, http(s)://, s3://); ``roots`` and ``s3_prefixes``:
    where the job's team may read file:// and s3:// sources."""
    scheme = _target(uri)[0].scheme
    if scheme == "file":
        return FileSource(uri, roots=roots, allow_hardlinks=allow_hardlinks)
    if scheme in ("http", "https"):
        return HttpSource(uri, allow_private=allow_private, timeout=timeout)
    if scheme == "s3":
        try:
            return FsspecSource(declaration.check_s3_under(uri, s3_prefixes))
        except declaration.OutsideTeamPrefix as exc:
            raise transfers.TransferFailed(str(exc)) from exc
    raise transfers.TransferFailed(f"{scheme}:// sources are not supported")
