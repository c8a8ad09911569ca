"""A job's secrets are masked in its log however the output is cut into reads."""

import re
import time

from hypothesis import given
from hypothesis import strategies as st

from jobs.masking import SecretMask

SECRETS = {"WANDB_API_KEY": "wandb-7f3c9e1a", "HF_TOKEN": "hf_abc", "INNER": "7f3c"}


def masked_stream(text: bytes, cuts: list[int], secrets=SECRETS) -> bytes:
    mask = SecretMask(secrets)
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    return b"".join(mask.feed(piece) for piece in pieces) + mask.flush()


def test_a_value_split_across_reads_is_masked_whole():
    out = masked_stream(b"key=wandb-7f3c9e1a done\n", [7, 12])
    assert out == b"key=[secret WANDB_API_KEY] done\n"


def test_a_value_holding_another_is_masked_as_the_longer_one():
    assert masked_stream(b"7f3c and wandb-7f3c9e1a", []) == b"[secret INNER] and [secret WANDB_API_KEY]"


def test_without_secrets_the_stream_passes_unchanged():
    assert masked_stream(b"hello\n", [2], secrets={}) == b"hello\n"


@given(
    st.lists(st.sampled_from([b"x", b"\n", b"wandb-7f3c9e1a", b"hf_abc", b"wandb-7f", b"hf_"]), max_size=30),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_no_cut_of_the_stream_lets_a_value_through(parts, cuts):
    text = b"".join(parts)
    out = masked_stream(text, cuts)
    assert out == masked_stream(text, [])  # the cut points change nothing
    for value in SECRETS.values():
        assert value.encode() not in out


def test_a_value_printed_right_after_another_that_ends_as_it_begins_is_masked_too():
    """A user name and then a token, where the name's end ("hf") is the token's start: both are masked."""
    secrets = {"HF_USER": "alice-hf", "HF_TOKEN": "hf_Zq8sVbT0kP2mW4xY"}
    out = masked_stream(b"login alice-hf_Zq8sVbT0kP2mW4xY\n", [], secrets)
    assert out == b"login [secret HF_USER][secret HF_TOKEN]\n"


OVERLAPPING = {"A": "abca", "B": "cab", "C": "bb"}


def _uncovered(text: bytes, secrets: dict[str, str]) -> bytes:
    """The bytes of ``text`` no occurrence of any value covers (overlapping occurrences included)."""
    covered = set()
    for value in map(str.encode, secrets.values()):
        for start in range(len(text)):
            if text.startswith(value, start):
                covered.update(range(start, start + len(value)))
    return bytes(byte for i, byte in enumerate(text) if i not in covered)


@given(
    st.lists(st.sampled_from([b"a", b"b", b"c", b"x", b"abca", b"cab", b"bb"]), max_size=30),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_every_byte_of_every_occurrence_is_masked_however_values_overlap(parts, cuts):
    text = b"".join(parts)
    out = masked_stream(text, cuts, OVERLAPPING)
    assert out == masked_stream(text, [], OVERLAPPING)
    assert re.sub(rb"\[secret [ABC]\]", b"", out) == _uncovered(text, OVERLAPPING)


def test_a_long_secret_a_job_prints_almost_does_not_hold_up_the_agent():
    """A team's secret of 65,535 'A's and a 'B', and a job printing 'A's: every read was searched for the value
    at every byte, 1.3 s of the agent's interpreter per 64 KiB read, during which none of its other threads
    (other teams' log captures and stop checks, the node's heartbeat) ran. The mask reads in time linear in the
    output: here sixteen reads took 100 s."""
    mask = SecretMask({"LONG": "A" * 65_535 + "B"})
    chunk = b"A" * 65_536
    began = time.perf_counter()
    out = b"".join(mask.feed(chunk) for _ in range(16)) + mask.flush()
    took = time.perf_counter() - began
    assert out == chunk * 16  # no occurrence: nothing masked, nothing lost
    assert took < 0.5, f"16 reads masked in {took:.2f} s"


def test_a_job_printing_its_own_repeating_secret_over_and_over_does_not_hold_up_the_agent():
    """The job knows its secret: a value of 4,096 'a's printed as 'a's matches at every byte, and looking for the
    next match from the byte after each one compared the whole value again (4.1 s for eight reads). A repeating
    value's next match is one period on, found by comparing the period's bytes only."""
    for value, out in (("a" * 4096, b"a"), ("ab" * 4096, b"ab")):
        mask = SecretMask({"REPEATING": value})
        chunk = out * (65_536 // len(out))
        began = time.perf_counter()
        masked = b"".join(mask.feed(chunk) for _ in range(8)) + mask.flush()
        took = time.perf_counter() - began
        assert masked == b"[secret REPEATING]", masked[:80]  # one region: every byte masked, under one label
        assert took < 1.5, f"{value[:4]}…: 8 reads masked in {took:.2f} s"
