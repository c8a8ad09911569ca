"""STAGE for a job's image: its reference resolved to a digest, pulled and unpacked before RENT, off the meter.

The image lands in the pool's cache (E31_STAGING_ROOT/images/<key>/: ``oci/`` the OCI layout skopeo
wrote, ``bundle/rootfs`` what umoci unpacked), keyed by the team and the manifest digest, so a later
job of the team running the same image moves no layer again: only its reference is resolved (one
manifest request), which is also what proves the team still reaches it. The job records the digest it
resolved to and runs exactly that. Progress, pinning and eviction follow the data cache's rules.
"""

import hashlib
import logging
import time
import uuid
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import team_secrets
from jobs import cache_fill, imageref, selectors, transfers, trees
from jobs.models import DatasetCacheEntry, ImageCacheEntry, ImagePull, Job
from jobs.transfers import registry, sources
from jobs.units import format_size

log = logging.getLogger(__name__)

FILLING, READY = ImageCacheEntry.FILLING, ImageCacheEntry.READY
HIT, FILL, WAIT, SLOT = "hit", "fill", "wait", "slot"
UNPACKING = "unpacking the image's layers into its root filesystem"


class ImageFailed(Exception):
    """The image cannot be staged: the registry's answer (missing, refused) or its last error after retries."""


class ImageStopped(Exception):
    """The job left STAGING (cancelled) while its image was moving."""


def images_dir() -> Path:
    return settings.E31_STAGING_ROOT / "images"


def entry_dir(key: str) -> Path:
    return images_dir() / key


def rootfs(key: str) -> Path:
    return entry_dir(key) / "bundle" / "rootfs"


def cache_key(*, team_id: int, digest: str) -> str:
    return hashlib.sha256(f"image:{team_id}\n{digest}".encode()).hexdigest()


def stage_image(*, job_id: int) -> None:
    """Puts the job's image in place and records its digest; ImageFailed or ImageStopped otherwise."""
    job = Job.objects.get(id=job_id)
    pull, _ = ImagePull.objects.get_or_create(job_id=job_id, defaults={"reference": job.image})
    if _already_in_place(pull):
        return  # a re-driven stager after a takeover: the image was in place before
    beat = _Beat(pull)
    try:
        ref = imageref.parse(job.image)
        # The pull uses the team's registry login: only for a job whose submitter may still act for the team,
        # as the node agent checks again at the start.
        team_secrets.check_submitter(team_id=job.team_id, user_id=job.submitted_by_id)
        access = registry_access(team_id=job.team_id, ref=ref)
        if pull.stage_state == "waiting" and pull.digest:  # a try after a wait: the image the tag named then
            resolved = registry.Resolved(digest=pull.digest, bytes=pull.bytes)
        else:
            resolved = _retrying(lambda: registry.resolve(ref, access=access), beat)
            _record_digest(pull, resolved)
        _stage_digest(pull, job.team_id, ref, resolved, access, beat)
    # Transient: the registry's name did not resolve this time (a lookup that times out): the job fails
    # with the reason rather than stay in STAGING, re-driven forever.
    except (
        transfers.TransferFailed,
        transfers.Transient,
        imageref.BadReference,
        team_secrets.SecretsUnavailable,
    ) as exc:
        ImagePull.objects.filter(id=pull.id).update(
            stage_state="failed", rate_bytes_s=0, stage_detail=str(exc)[:500]
        )
        raise ImageFailed(f"image {job.image}: {exc}") from exc
    except ImageStopped:
        ImagePull.objects.filter(id=pull.id).update(stage_state="cancelled", rate_bytes_s=0)
        raise


def registry_access(*, team_id: int, ref: imageref.Reference) -> registry.Access:
    """How the node reaches the image's registry for this team.

    A pool's own registry (E31_POOL_REGISTRIES) may be private and plain HTTP; any other is reached
    over verified TLS, and only on public addresses unless private sources are allowed: checked here once to
    fail early, then on every connection skopeo makes (``egress``). The login is
    the team's registry credential when it stored one (see ``team_credentials``); anonymous otherwise.
    """
    pool = ref.registry in settings.E31_POOL_REGISTRIES
    if not pool and not settings.E31_OUTSIDE_REGISTRIES:
        raise transfers.TransferFailed(
            f"{ref.registry} is not one of the pool's registries (E31_POOL_REGISTRIES), and pulls from outside "
            "registries are off on this pool (E31_OUTSIDE_REGISTRIES): ask an operator"
        )
    if not pool:
        host, _, port = ref.registry.partition(":")
        sources.checked_addresses(host, int(port or 443), allow_private=settings.E31_ALLOW_PRIVATE_SOURCES)
    username, password = team_credentials(team_id=team_id, registry_host=ref.registry)
    # An outside registry's every connection (its redirects and token realms too) goes through the egress proxy,
    # which checks the addresses again: the name may answer otherwise now (rebinding), and skopeo resolves it itself.
    return registry.Access(
        tls_verify=not pool, username=username, password=password, timeout_s=settings.E31_TRANSFER_TIMEOUT_S,
        pinned_egress=not pool, allow_private=settings.E31_ALLOW_PRIVATE_SOURCES,
    )  # fmt: skip


def team_credentials(*, team_id: int, registry_host: str) -> tuple[str, str]:
    """The team's login for ``registry_host`` (its secret REGISTRY_<host>): ("", "") for an anonymous pull.

    The one place a pull learns credentials: the values go to skopeo in a 0600 auth file of the pull's
    own, never on a command line, in a log or on a page; the job itself gets them only if it declares them.
    """
    return team_secrets.registry_login(team_id=team_id, registry_host=registry_host)


def _already_in_place(pull: ImagePull) -> bool:
    return (
        pull.stage_state in ("staged", "cached")
        and pull.entry_id is not None
        and ImageCacheEntry.objects.filter(id=pull.entry_id, state=READY).exists()
        and rootfs(pull.entry.key).is_dir()
    )


def _record_digest(pull: ImagePull, resolved: registry.Resolved) -> None:
    pull.digest, pull.bytes = resolved.digest, resolved.bytes
    ImagePull.objects.filter(id=pull.id).update(
        digest=resolved.digest, bytes=resolved.bytes, bytes_done=0, stage_state="staging",
        stage_started_at=timezone.now(), stage_detail="",
    )  # fmt: skip


def _stage_digest(
    pull: ImagePull, team_id: int, ref: imageref.Reference, resolved: registry.Resolved, access: registry.Access,
    beat: "_Beat",
) -> None:  # fmt: skip
    key = cache_key(team_id=team_id, digest=resolved.digest)
    token = uuid.uuid4().hex
    while True:
        outcome, entry = _try_claim(key=key, team_id=team_id, reference=ref.pinned(resolved.digest),
                                    digest=resolved.digest, compressed=resolved.bytes, token=token,
                                    now=timezone.now(), pull=pull)  # fmt: skip
        if outcome == HIT:
            _mark(pull, entry, "cached", resolved.bytes, "served from the pool cache: 0 bytes moved")
            return
        if outcome == WAIT:
            why = "another job is pulling the same image; it will be shared"
            beat.update_row(stage_state="waiting", stage_detail=why)
            raise cache_fill.SharedCopy(why)
        if outcome == SLOT:
            _wait_for_slot(beat, team_id, pull.job_id)
        beat.update_row(stage_state="staging", stage_detail="")
        beat.entry_id, beat.token = entry.id, token
        try:
            moved = _fill(entry, token, ref, resolved, access, beat, pull)
        except transfers.TransferStopped:
            if beat.stopped == "cancelled":
                raise ImageStopped() from None
            beat.entry_id = None
            continue  # another stager took the entry over: wait for it, or hit what it filled
        _mark(pull, entry, "staged", moved, "")
        return


def _wait_for_slot(beat: "_Beat", team_id: int, job_id: int) -> None:
    """The pull shows why it waits, and NoSlot gives the stager's thread back (no entry is claimed yet)."""
    why = cache_fill.slot_refusal(timezone.now(), team_id=team_id, job_id=job_id)
    why = why or "waiting for a transfer slot"  # one freed as this looked: the next try takes it
    beat.update_row(stage_state="waiting", stage_detail=why)
    raise cache_fill.NoSlot(why)


@transaction.atomic
def _try_claim(
    *, key: str, team_id: int, reference: str, digest: str, token: str, now: datetime, pull: ImagePull,
    compressed: int = 0,
):  # fmt: skip
    """HIT (pinned for this pull), WAIT (another is filling it), FILL (this pull fills it, holding a
    transfer slot) or SLOT (it must be pulled, but every transfer slot is taken, or its team holds its most).

    A FILL's entry counts at its cap (``_cap``; ``compressed``, what the pull moves, is 0 where the manifest
    declares no sizes) until it is ready, as a data fill counts at its declared bytes: the room data fills are
    checked against (``staging.claim_slot``) then leaves the image's."""
    entry = ImageCacheEntry.objects.select_for_update().filter(key=key).first()
    if entry is not None and entry.state == READY and rootfs(key).is_dir():
        ImageCacheEntry.objects.filter(id=entry.id).update(hits=entry.hits + 1, last_used_at=now)
        _pin(pull, entry)
        return HIT, entry
    if entry is not None and entry.state == FILLING and entry.updated_at >= cache_fill.stale_before(now):
        return WAIT, entry
    # New, its files gone, or its filler silent: this pull fills it, once a slot is free. The slots' lock
    # is taken only here, after the entry's row: a hit never waits for it, and nothing that holds it waits
    # for an image row (data claims lock only their input).
    cache_fill.lock_slots()
    if not cache_fill.slot_free(now, team_id=team_id, job_id=pull.job_id):
        return SLOT, None
    cache_fill.out_of_line(pull.job_id)  # it takes the slot, or shares a copy begun a moment ago
    team_room = cache_fill.team_share_bytes() - team_cache_bytes(team_id, now, except_image=key)
    cap = _cap(compressed, room=min(_room(now, key=key), team_room))
    if entry is None:
        try:
            with transaction.atomic():
                return FILL, ImageCacheEntry.objects.create(
                    key=key, team_id=team_id, reference=reference, digest=digest, state=FILLING,
                    filler=token, bytes=cap, created_at=now, updated_at=now, last_used_at=now,
                )  # fmt: skip
        except IntegrityError:
            return WAIT, None  # another stager created it a moment ago
    ImageCacheEntry.objects.filter(id=entry.id).update(state=FILLING, filler=token, bytes=cap, updated_at=now)
    entry.bytes = cap
    return FILL, entry


def _room(now: datetime, *, key: str) -> int:
    """The cache's bytes no sweep can free for this image: E31_STAGE_CACHE_BYTES less the ready entries a live job
    pins and the fills in progress, datasets and images alike. Unpinned entries count as room, as a sweep evicts
    them to make it (the cache may then hold more than its capacity until it runs). Call it under ``lock_slots``:
    two fills then cannot each count the room the other is about to take."""
    fresh = cache_fill.stale_before(now)
    pinned_data = DatasetCacheEntry.objects.filter(state=READY, inputs__job__state__in=selectors.ALIVE_STATES)
    held = (
        DatasetCacheEntry.objects.filter(id__in=pinned_data.values("id")),
        DatasetCacheEntry.objects.filter(state=FILLING, updated_at__gte=fresh),
        ImageCacheEntry.objects.filter(id__in=_pinned().values("id")),
        ImageCacheEntry.objects.filter(state=FILLING, updated_at__gte=fresh).exclude(key=key),
    )
    return settings.E31_STAGE_CACHE_BYTES - selectors.total_bytes(*held)


def team_cache_bytes(
    team_id: int, now: datetime, *, except_dataset: int | None = None, except_image: str = ""
) -> int:
    """What one team holds of the staging cache: its inputs being copied (at their declared bytes), the entries its
    live jobs pin, and its images pinned or being pulled; what E31_STAGE_TEAM_SHARE bounds."""
    fresh = cache_fill.stale_before(now)
    copying = (
        cache_fill.copying_fills(now).filter(filling_input__job__team_id=team_id).exclude(id=except_dataset)
    )
    pinned = DatasetCacheEntry.objects.filter(
        state=READY, inputs__job__team_id=team_id, inputs__job__state__in=selectors.ALIVE_STATES
    )
    images = ImageCacheEntry.objects.filter(team_id=team_id)
    return selectors.total_bytes(
        copying,
        DatasetCacheEntry.objects.filter(id__in=pinned.values("id")),
        images.filter(id__in=_pinned().values("id")),
        images.filter(state=FILLING, updated_at__gte=fresh).exclude(key=except_image),
    )


def _cap(compressed: int, *, room: int) -> int:
    """The most the image's entry (its layout and its unpacked root) may hold: the cache's room, and no more
    than E31_IMAGE_UNPACK_RATIO times its compressed layers unpacked beside them. TransferFailed, before any layer
    moves, when the layers alone are more than the room. A manifest declaring no sizes (Docker's old schema 1)
    is capped by the room until its pull shows its size (``_unpack_cap``)."""
    if compressed > room:
        log.warning("staging cache: %d bytes left, an image of %d compressed refused", room, compressed)
        raise transfers.TransferFailed(
            f"the image's layers are {format_size(compressed)} compressed, more than the {_room_text()}"
        )
    return min(room, (1 + settings.E31_IMAGE_UNPACK_RATIO) * compressed) if compressed else room


def _room_text() -> str:
    """What the team is told of the room: the cache's capacity, never what is left of it (every team's inputs
    and images count in that; the log has it where an image is refused)."""
    capacity = settings.E31_STAGE_CACHE_BYTES
    return (
        f"room the staging cache has now ({format_size(capacity)}, E31_STAGE_CACHE_BYTES, shared by the inputs "
        "and images of the pool's jobs not yet released and the copies in progress; one team's hold at most "
        "E31_STAGE_TEAM_SHARE of it)"
    )


def _unpack_cap(entry: ImageCacheEntry, declared: int, layout: Path) -> registry.Cap:
    """What the unpacked image may hold, and why: E31_IMAGE_UNPACK_RATIO times what its pull wrote, or, where
    the room was the lower bound when it was claimed, the entry's cap less that."""
    ratio = settings.E31_IMAGE_UNPACK_RATIO
    pulled = registry.tree_bytes(layout)
    by_ratio = registry.Cap(
        ratio * pulled,
        f"{format_size(ratio * pulled)}, {ratio} times the {format_size(pulled)} pulled (E31_IMAGE_UNPACK_RATIO)",
    )
    by_room = registry.Cap(
        entry.bytes - pulled, f"what, beside the {format_size(pulled)} pulled, fits the {_room_text()}"
    )
    # By ratio, what was pulled is at most what the manifest declares (``registry.pull_limit``): bounded.
    room_bound = not declared or entry.bytes < (1 + ratio) * declared
    return by_room if room_bound and by_room.bytes < by_ratio.bytes else by_ratio


def _fill(
    entry: ImageCacheEntry, token: str, ref: imageref.Reference, resolved: registry.Resolved,
    access: registry.Access, beat: "_Beat", pull: ImagePull,
) -> int:  # fmt: skip
    """Pulls into a directory of this pull's own, unpacks it, then moves it in place in one rename."""
    part = images_dir() / f"{entry.key}.{token}.part"
    try:
        beat.began = time.monotonic()
        moved = _retrying(
            lambda: registry.pull(
                ref,
                resolved.digest,
                part / "oci",
                access=access,
                progress=beat,
                floor=cache_fill.transfer_floor(),
                limit=registry.pull_limit(resolved.bytes) or registry.Cap(entry.bytes, f"the {_room_text()}"),
            ),
            beat,
        )
        beat.still_going()  # the steps below report no progress: keep the claim (and its slot) fresh
        beat.update_row(stage_detail=UNPACKING)
        cap = _unpack_cap(entry, resolved.bytes, part / "oci")
        registry.unpack(part / "oci", part / "bundle", beat=beat.still_going, cap=cap)
        beat.still_going()
        config = registry.image_config(part / "oci")
        _open_to_jobs(part)
        size = registry.tree_bytes(part)
        beat.still_going()
        trees.remove_tree(entry_dir(entry.key))  # what a lost filler left, if anything
        part.rename(entry_dir(entry.key))
    except BaseException:
        trees.remove_tree(part)
        ImageCacheEntry.objects.filter(id=entry.id, filler=token).delete()
        raise
    now = timezone.now()
    with transaction.atomic():
        if ImageCacheEntry.objects.filter(id=entry.id, filler=token).update(
            state=READY, filler="", bytes=size, config=config, updated_at=now, last_used_at=now
        ):
            _pin(pull, entry)
    return moved


def _pin(pull: ImagePull, entry: ImageCacheEntry) -> None:
    """The pull names its entry in the transaction that finds it ready or makes it so: from then on its live job
    keeps the entry from eviction (``unpinned``); a sweep between the two would leave the job nothing to run."""
    ImagePull.objects.filter(id=pull.id).update(entry=entry)


def _open_to_jobs(part: Path) -> None:
    """Job uids (bubblewrap runs as the job) pass through to the root filesystem, never list the cache."""
    for folder in (images_dir(), part, part / "bundle"):
        folder.chmod(0o711)
    (part / "oci").chmod(0o700)


def _mark(pull: ImagePull, entry: ImageCacheEntry, state: str, moved: int, detail: str) -> None:
    elapsed = (timezone.now() - pull.stage_started_at).total_seconds() if pull.stage_started_at else 0
    ImagePull.objects.filter(id=pull.id).update(
        entry=entry, stage_state=state, bytes_done=pull.bytes, stage_finished_at=timezone.now(),
        rate_bytes_s=moved / elapsed if state == "staged" and elapsed > 0 else 0, stage_detail=detail,
    )  # fmt: skip


def _retrying(call, beat: "_Beat"):
    """Retries what the registry may answer next time (down, 5xx, timeout); then fails with its reason."""
    for attempt in range(settings.E31_TRANSFER_RETRIES + 1):
        try:
            return call()
        except transfers.Transient as exc:
            if attempt == settings.E31_TRANSFER_RETRIES:
                raise transfers.TransferFailed(
                    f"the registry did not answer after {attempt + 1} tries: {exc}"
                ) from exc
            beat.retrying(attempt + 1, str(exc))
            time.sleep(min(transfers.MAX_BACKOFF_S, settings.E31_TRANSFER_BACKOFF_S * 2**attempt))
    raise AssertionError("unreachable")


class _Beat(cache_fill.FillWatch):
    """A pull: its ImagePull shows the progress; it fills an image cache entry."""

    entries = ImageCacheEntry
    stopped_error = ImageStopped

    def retrying(self, tries: int, reason: str) -> None:
        self.update_row(stage_detail=f"retry {tries}: {reason}"[:500])
        if not self.job_alive():
            raise ImageStopped()


# --------------------------------------------------------------------------- eviction


def unpinned():
    """Ready images no live job (not yet released or ended) runs."""
    return ImageCacheEntry.objects.filter(state=READY).exclude(pulls__job__state__in=selectors.ALIVE_STATES)


def _pinned():
    return ImageCacheEntry.objects.filter(state=READY, pulls__job__state__in=selectors.ALIVE_STATES)


@transaction.atomic
def evict(entry_id: int) -> bool:
    entry = (
        ImageCacheEntry.objects.select_for_update(skip_locked=True).filter(id=entry_id, state=READY).first()
    )
    if entry is None or entry.pulls.filter(job__state__in=selectors.ALIVE_STATES).exists():
        return False  # pinned meanwhile, or another sweep has it
    trees.remove_tree(entry_dir(entry.key))
    entry.delete()
    return True


def remove_orphan_parts(now: datetime) -> None:
    """Pull directories of fills that died with their worker (a live fill keeps its claim fresh)."""
    cache_fill.remove_orphan_parts(images_dir(), ImageCacheEntry, now=now, remove=trees.remove_tree)
