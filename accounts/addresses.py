"""An e-mail address as accounts keep it: one plain form, so an address that only looks like another never names it.

Accounts are found by their address case-blind (``iexact``: UPPER() on PostgreSQL), which folds some letters
outside ASCII into ASCII ones (UPPER of a dotless i is I): victim@gma\u0131l.com, another domain, would name the
account of victim@gmail.com. Kept in ASCII (the domain in its IDNA form, the part before the @ refused outside
ASCII rather than guessed at), two addresses differ case-blind exactly when they differ.
"""


class NotPlain(ValueError):
    """An address with no plain form; the message says why, in words for the person who typed it."""


def canonical(address: str) -> str:
    """``address`` stripped, its domain in IDNA ASCII, lowercased; NotPlain if it has none. Not an address at all
    (no @) is only lowercased: the form's validator says what is wrong with it."""
    address = address.strip()
    local, at, domain = address.rpartition("@")
    if not at:
        return address.lower()
    if not local.isascii():
        raise NotPlain(
            "Use an address whose part before the @ is plain ASCII: letters beyond it can look like another "
            "person's address."
        )
    try:
        domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        raise NotPlain("The part after the @ is not a domain name.") from None
    return f"{local}@{domain}".lower()
