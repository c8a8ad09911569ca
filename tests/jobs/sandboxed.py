"""Running a command as a job in the real sandbox, with no agent or database: for the tests of what a job can reach."""

import shutil
import tempfile
from pathlib import Path

from jobs import sandbox, syscalls
from tests import machine

ROOT_AND_BWRAP = machine.needs(root=True, bwrap=True)


def allow_all() -> bytes:
    """A filter that refuses nothing: the same mechanism as the job filter, for a test or a bench of what lies
    under it."""
    import pyseccomp

    return syscalls.export(pyseccomp.SyscallFilter(pyseccomp.ALLOW))


def run_job(uid: int, argv: list[str]) -> str:
    """``argv`` run as an attempt under ``uid`` would be (its own directories, view and syscall filter): its output."""
    state = Path(tempfile.mkdtemp(prefix="e31-sandbox-"))
    state.chmod(0o711)
    try:
        root = state / "attempt"
        dirs = sandbox.AttemptDirs(root=root, work=root / "work", output=root / "output", data=state / "data")
        dirs.create(owner=uid)
        sandbox.write_identity(dirs, uid=uid, gid=uid)
        confinement = sandbox.Confinement(uid=uid, gid=uid)
        cmd = sandbox.command(argv=argv, env={"PATH": "/usr/bin:/bin"}, dirs=dirs, workdir="",
                              mode=sandbox.BUBBLEWRAP, confinement=confinement)  # fmt: skip
        proc = sandbox.launch(cmd, env={}, cwd=dirs.work, mode=sandbox.BUBBLEWRAP, confinement=confinement)
        return proc.communicate(timeout=60)[0].decode().strip()
    finally:
        shutil.rmtree(state)
