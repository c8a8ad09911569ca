"""Removing a tree that a job or an image made, however deep it nests."""

import subprocess
from pathlib import Path


def remove_tree(*paths: Path) -> None:
    """``rm -rf --one-file-system``: it walks without recursing, so no depth a job or an image made stops it
    (``shutil.rmtree`` raises RecursionError past about a thousand levels on Python 3.11, whatever
    ``ignore_errors`` says), and it never crosses into a mount; a missing path is no error."""
    subprocess.run(["rm", "-rf", "--one-file-system", "--", *map(str, paths)], check=False, timeout=600)
