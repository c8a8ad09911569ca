from django import forms
from django.core.exceptions import ValidationError

from accounts.addresses import NotPlain, canonical


class AddressField(forms.EmailField):
    """An e-mail address as it is stored (``accounts.addresses.canonical``), its length checked in that form."""

    def to_python(self, value: str | None) -> str:
        try:
            return canonical(super().to_python(value))
        except NotPlain as exc:
            raise ValidationError(str(exc), code="invalid") from None


class InviteForm(forms.Form):
    # 150: the address becomes the invited person's username, which Django caps there.
    email = AddressField(label="E-mail address", max_length=150)
