from django import forms
from django.core.exceptions import ValidationError


class AddressField(forms.EmailField):
    """An e-mail address as it is stored: stripped, its domain in its ASCII (IDNA) form, lowercased.

    Accounts are found by their address case-blind (``iexact``: UPPER() on PostgreSQL), which folds some letters
    outside ASCII into ASCII ones (UPPER('\u0131') is 'I'): victim@gma\u0131l.com, another domain, would name the account of
    victim@gmail.com. Kept in ASCII, two addresses differ case-blind exactly when they differ; a local part
    outside ASCII is refused rather than guessed at.
    """

    def to_python(self, value: str | None) -> str:
        address = super().to_python(value)
        local, at, domain = address.rpartition("@")
        if not at:
            return address.lower()  # not an address: the validator says so
        if not local.isascii():
            raise ValidationError(
                "Use an address whose part before the @ is plain ASCII: letters beyond it can look like another "
                "person's address.",
                code="invalid",
            )
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValidationError("The part after the @ is not a domain name.", code="invalid") from None
        # Lowercased here, not only by the writer: the stored form's length is the one checked.
        return f"{local}@{domain}".lower()


class InviteForm(forms.Form):
    # 150: the address becomes the invited person's username, which Django caps there.
    email = AddressField(label="E-mail address", max_length=150)
