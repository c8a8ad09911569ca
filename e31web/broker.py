"""The embedded broker: kombu's filesystem transport, made safe to read while others write.

kombu's own transport writes a message file in place and its reader takes the file without a
lock, so under a burst of publishes a worker can read an empty or half-written file; the
``JSONDecodeError`` that follows kills the worker (issue 15). Here every file appears whole or not
at all: it is written under a hidden name in the same folder and renamed into place (rename is
atomic within a filesystem), and the binding tables are replaced the same way under a lock file.
A reader claims a message by renaming it into the processing folder (one reader wins), deletes it
once read, and moves a file it cannot decode aside with a log line instead of dying: the database
is the truth, so the reconciler re-drives whatever such a message would have rung for.

A message published with an expiration (beat's periodic passes expire after their own period) carries
its deadline in its file name, and once past it the file is deleted, unread, by the next reader's scan
or by a publisher's sweep (at most every ``SWEEP_EVERY_S``), as RabbitMQ drops a message past its TTL.
So while no worker reads (the control worker down) the folder holds the passes still due, not every
pass beat has published since, and a worker that comes back is handed none of them to replay.
"""

import fcntl
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from time import monotonic

from kombu.transport import filesystem, virtual
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

log = logging.getLogger(__name__)

UNREADABLE_SUFFIX = ".unreadable"
SWEEP_EVERY_S = 10.0
_DEADLINE = re.compile(r"_expires(\d+)$")  # in a file name's stem: wall-clock milliseconds


def _expired(name: str, now_ms: int) -> bool:
    """Whether the message file ``name`` is past the deadline it was published with (most have none)."""
    deadline = _DEADLINE.search(name.partition(".")[0])
    return deadline is not None and int(deadline[1]) <= now_ms


def _now_ms() -> int:
    return int(time.time() * 1000)


def write_atomically(folder: str | Path, name: str, data: bytes) -> None:
    """``folder/name`` appears with all of ``data`` or not at all (hidden names are never read)."""
    hidden = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(hidden, "wb") as handle:
            handle.write(data)
        os.rename(hidden, os.path.join(folder, name))
    except BaseException:
        with _ignoring_missing():
            os.unlink(hidden)
        raise


@contextmanager
def _ignoring_missing() -> Iterator[None]:
    try:
        yield
    except FileNotFoundError:
        pass


class Channel(filesystem.Channel):
    _swept_at = 0.0  # monotonic time of this channel's last sweep as a publisher

    def _put(self, queue: str, payload: dict, **kwargs) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}{self._deadline(payload)}.{queue}.msg"
        try:
            write_atomically(self.data_folder_out, name, dumps(payload).encode())
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add {name!r} to {self.data_folder_out}") from exc
        if monotonic() - self._swept_at >= SWEEP_EVERY_S:  # no reader may be there to do it
            self._swept_at = monotonic()
            self._drop_expired(os.listdir(self.data_folder_out), folder=self.data_folder_out)

    @staticmethod
    def _deadline(payload: dict) -> str:
        """The file name's mark of the message's deadline: its AMQP expiration (milliseconds from now)."""
        try:
            expiration = float(payload["properties"]["expiration"])
        except (KeyError, TypeError, ValueError):
            return ""
        return f"_expires{_now_ms() + round(expiration)}"

    def _drop_expired(self, names: list[str], *, folder: str) -> list[str]:
        """Deletes the message files past their deadline, unread; returns the other names."""
        now_ms, kept, dropped = _now_ms(), [], 0
        for name in names:
            if _expired(name, now_ms):
                with _ignoring_missing():  # a reader claimed it first: the worker discards it
                    os.unlink(os.path.join(folder, name))
                    dropped += 1
            else:
                kept.append(name)
        if dropped:
            log.debug("dropped %d expired broker message(s) from %s", dropped, folder)
        return kept

    def _get(self, queue: str) -> dict:
        wanted = f"{queue}.msg"
        names = self._drop_expired(os.listdir(self.data_folder_in), folder=self.data_folder_in)
        for name in sorted(names):
            if name.partition(".")[2] != wanted:
                continue  # another queue's message, or a hidden file still being written
            claimed = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except OSError:
                continue  # another reader claimed it first
            message = self._read_claimed(claimed)
            if message is not None:
                return message
        raise Empty()

    def _read_claimed(self, path: str) -> dict | None:
        """The message in a claimed file (then deleted), or None for one that cannot be decoded."""
        try:
            with open(path, "rb") as handle:
                message = loads(handle.read())
            if not isinstance(message, dict):
                raise ValueError(f"a message is a JSON object, not {type(message).__name__}")
        except (OSError, ValueError) as exc:
            log.error(
                "unreadable broker message %s set aside (%s); the reconciler re-drives its work", path, exc
            )
            with _ignoring_missing():
                os.replace(path, path + UNREADABLE_SUFFIX)
            return None
        if not self.store_processed:
            with _ignoring_missing():
                os.unlink(path)
        return message

    def get_table(self, exchange: str) -> list:
        try:
            text = self._exchange_file(exchange).read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open the table of {exchange!r}") from exc
        return [filesystem.exchange_queue_t(*q) for q in loads(text)]

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange):
            table = self.get_table(exchange)
            if entry not in table:
                self._write_table(exchange, [entry, *table])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args, **kwargs) -> None:
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange):
            table = self.get_table(exchange)
            if entry in table:
                self._write_table(exchange, [q for q in table if q != entry])

    @contextmanager
    def _table_lock(self, exchange: str) -> Iterator[None]:
        """Serialises the read-modify-write of one table; readers need no lock (the file is replaced whole)."""
        self.control_folder.mkdir(exist_ok=True)
        with open(self._exchange_file(exchange).with_suffix(".lock"), "ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield

    def _write_table(self, exchange: str, table: list) -> None:
        file = self._exchange_file(exchange)
        write_atomically(file.parent, file.name, dumps(table).encode())

    @cached_property
    def processed_folder(self) -> str:
        # Claims stay on the queue's filesystem, so that rename is atomic (kombu's default is /tmp).
        folder = self.transport_options.get("processed_folder") or os.path.join(
            self.data_folder_in, ".claimed"
        )
        os.makedirs(folder, exist_ok=True)
        return folder


class Transport(filesystem.Transport):
    Channel = Channel
    global_state = virtual.BrokerState()
