from django import forms


class InviteForm(forms.Form):
    # 150: the address becomes the invited person's username, which Django caps there.
    email = forms.EmailField(label="E-mail address", max_length=150)
