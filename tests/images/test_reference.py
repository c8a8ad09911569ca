"""Image references as a declaration names them: registry/name:tag or registry/name@sha256:<digest>."""

import pytest

from jobs import imageref

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("registry.example.com/team/trainer:2.1", "registry.example.com", "team/trainer", "2.1", ""),
        ("127.0.0.1:5000/busybox:1", "127.0.0.1:5000", "busybox", "1", ""),
        ("localhost/tools/py", "localhost", "tools/py", "latest", ""),
        (f"reg.example/a/b@{DIGEST}", "reg.example", "a/b", "", DIGEST),
        (f"reg.example/a/b:v1@{DIGEST}", "reg.example", "a/b", "v1", DIGEST),
        (
            "reg.example:443/my_app.x-y/sub__part:v1.0-rc_2",
            "reg.example:443",
            "my_app.x-y/sub__part",
            "v1.0-rc_2",
            "",
        ),
    ],
)
def test_a_reference_names_its_registry_repository_and_tag_or_digest(text, registry, repository, tag, digest):
    ref = imageref.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)


@pytest.mark.parametrize(
    "text",
    [
        "busybox",  # no registry: the default registry is never assumed
        "library/busybox:1",
        "reg.example/",
        "reg.example/a:",
        "reg.example/a@sha256:abc",
        "reg.example/a@md5:" + "ab" * 16,
        "reg.example/A:1",
        "reg.example/a:-bad",
        "reg.example/a:" + "x" * 129,
        "reg.example/a b:1",
        "reg.example/a:1\n",
        "-reg.example/a:1",
        "reg.example/a//b:1",
        "reg.example/../a:1",
        "docker://reg.example/a:1",
        "reg.example.com:99999/a/b:1",  # no such port: the node's lookup would fail forever, not once
        "reg.example.com:0/a/b:1",
        "r" * 64 + ".example.com/a:1",  # a DNS label is 63 characters at most: the lookup would raise
    ],
)
def test_a_bad_reference_is_refused_with_a_reason(text):
    with pytest.raises(imageref.BadReference) as caught:
        imageref.parse(text)
    assert str(caught.value)


def test_a_reference_pins_to_the_digest_it_resolved_to():
    ref = imageref.parse("reg.example/team/app:2")
    assert ref.pinned(DIGEST) == f"reg.example/team/app@{DIGEST}"
    assert str(ref) == "reg.example/team/app:2"
