"""How an event is signed (pure): HMAC-SHA256 over ``<timestamp>.<body>`` with the webhook's secret.

A receiver recomputes it from the ``E31-Webhook-Timestamp`` header and the raw body, compares in
constant time, and refuses a timestamp far from its clock (a replay).
"""

import hashlib
import hmac

ID_HEADER = "E31-Webhook-Id"
TIMESTAMP_HEADER = "E31-Webhook-Timestamp"
SIGNATURE_HEADER = "E31-Webhook-Signature"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def headers(*, secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        ID_HEADER: event_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }


def verify(secret: str, headers: dict[str, str], body: bytes, *, now: int, tolerance_s: int = 300) -> bool:
    """What a receiver does; the tests use it as one would."""
    try:
        timestamp = int(headers[TIMESTAMP_HEADER])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), headers.get(SIGNATURE_HEADER, ""))
