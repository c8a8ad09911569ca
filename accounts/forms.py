from django import forms


class AddressField(forms.EmailField):
    """An e-mail address as it is stored: stripped and lowercased before its length is checked."""

    def to_python(self, value: str | None) -> str:
        # Lowercased here, not only by the writer: some letters grow when lowercased ('İ' becomes two code points),
        # so an address that fits as typed could overflow the column once stored.
        return super().to_python(value).lower()


class InviteForm(forms.Form):
    # 150: the address becomes the invited person's username, which Django caps there.
    email = AddressField(label="E-mail address", max_length=150)
