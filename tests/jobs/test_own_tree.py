"""Handing a job's files over (to the agent after the job, to the next attempt's uid): everything under the root
changes owner, setuid/setgid bits go, and no link the job left leads the walk out of its root."""

import os
import stat

import pytest

from jobs import sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid needs root")
JOB_UID = 300888


def test_every_entry_changes_owner_and_loses_its_setuid_and_setgid_bits(tmp_path):
    root = tmp_path / "attempt"
    (root / "deep" / "deeper").mkdir(parents=True)
    tool = root / "deep" / "deeper" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o6755)
    (root / "deep").chmod(0o2775)
    sandbox.own_tree(root, uid=JOB_UID, gid=JOB_UID)
    for path in (root, root / "deep", root / "deep" / "deeper", tool):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (JOB_UID, JOB_UID), path
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755


def test_links_are_given_over_as_links_and_never_followed(tmp_path):
    host, root = tmp_path / "host", tmp_path / "attempt"
    host.mkdir()
    root.mkdir()
    (host / "passwd").write_text("root:x:0:0\n")
    (host / "passwd").chmod(0o4644)  # a setuid bit outside: the walk must not clear it either
    (root / "to-dir").symlink_to(host)
    (root / "to-file").symlink_to(host / "passwd")
    sandbox.own_tree(root, uid=JOB_UID, gid=JOB_UID)
    assert (root / "to-dir").lstat().st_uid == (root / "to-file").lstat().st_uid == JOB_UID
    outside = (host / "passwd").stat()
    assert (host.stat().st_uid, outside.st_uid) == (os.geteuid(), os.geteuid())
    assert outside.st_mode & stat.S_ISUID
