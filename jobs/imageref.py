"""OCI image references as a job declares them: ``registry/name:tag`` or ``registry/name@sha256:<digest>``.

The grammar is the distribution project's (the one registries and ``skopeo`` accept), with one
rule of ours: the registry is always named. A bare ``busybox`` would mean a public registry the
node may not reach, and a name that silently means a host is how jobs end up running the wrong
image. Plain Python, no Django: intake and the node both use it.
"""

import re
from dataclasses import dataclass

DEFAULT_TAG = "latest"
# A DNS label: 1 to 63 characters (a longer one makes the resolver raise, not answer).
_LABEL = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)"
# Whole-string patterns, used with fullmatch ("$" would also match before a trailing newline).
REGISTRY = re.compile(rf"localhost|{_LABEL}(?:\.{_LABEL})+|{_LABEL}(?:\.{_LABEL})*:[0-9]{{1,5}}")
COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_NAME = 255


class BadReference(ValueError):
    """Not an image reference this network pulls; the message says why."""


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str  # "" when only a digest was given
    digest: str  # "" when only a tag was given

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        """The same image by content: what the job records and every later pull asks for."""
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse(text: str) -> Reference:
    """The reference, or BadReference naming the part that is wrong."""
    if not isinstance(text, str) or not text or text != text.strip() or not text.isprintable():
        raise BadReference("an image reference is registry/name:tag or registry/name@sha256:<digest>")
    rest, _, digest = text.partition("@")
    if "@" in text and not DIGEST.fullmatch(digest):
        raise BadReference("a digest is sha256: and 64 lower-case hex digits")
    registry, slash, path = rest.partition("/")
    if not slash or not REGISTRY.fullmatch(registry):
        raise BadReference(
            "name the registry first (registry.example.com/team/app:tag): no default registry is assumed"
        )
    if ":" in registry and not 1 <= int(registry.rpartition(":")[2]) <= 65535:
        raise BadReference("a registry's port is between 1 and 65535")
    repository, tag = _split_tag(path)
    if not tag and not digest:
        tag = DEFAULT_TAG
    if len(registry) + 1 + len(repository) > MAX_NAME:
        raise BadReference(f"an image name is at most {MAX_NAME} characters")
    return Reference(registry=registry, repository=repository, tag=tag, digest=digest)


def _split_tag(path: str) -> tuple[str, str]:
    repository, colon, tag = path.rpartition(":") if ":" in path else (path, "", "")
    if colon and not TAG.fullmatch(tag):
        raise BadReference("a tag is letters, digits, _ . and -, at most 128, not starting with . or -")
    components = repository.split("/")
    if not all(COMPONENT.fullmatch(c) for c in components):
        raise BadReference("a repository is lower-case letters and digits, separated by . _ - or /")
    return repository, tag
