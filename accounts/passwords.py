"""A member's own password: changed while signed in, or set anew from a link mailed to the account's address.

Django's views do the work (its forms check the current password and the validators; its reset tokens are
single-use, as they hash the password they replace, and expire after PASSWORD_RESET_TIMEOUT). What they add here:
each change audited like the admin's (``user.account``, saying only that a password was set anew), the reset
link built on the console's own address (E31_CONSOLE_URL, as invitations are, never a request's Host), reset
requests limited per client address like the other public forms, and a refused form answered 422.
"""

import logging
from smtplib import SMTPException

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse_lazy
from django.utils import timezone
from django.utils.decorators import method_decorator

from accounts import services
from common import ratelimit
from common.ratelimit import limit_posts

log = logging.getLogger(__name__)
SET_ANEW = {"before": {"password": "was set"}, "after": {"password": "set anew"}}


def _audited(user) -> None:
    services.announce_account(name=user.get_username(), actor=user, now=timezone.now(), **SET_ANEW)


class _SetsAPassword:
    """A view whose valid form sets the user's password: audited in the same transaction, then ``done`` told."""

    done = ""

    @transaction.atomic  # the new password and its audit entry commit together
    def form_valid(self, form) -> HttpResponse:
        response = super().form_valid(form)
        _audited(form.user)
        messages.success(self.request, self.done)
        return response

    def form_invalid(self, form) -> HttpResponse:
        return self.render_to_response(self.get_context_data(form=form), status=422)


# Posts of the change form per account an hour: a session someone else got could otherwise guess the current
# password without end, each guess a password hash of the web worker's time.
CHANGE_TRIES = 10


class ChangePassword(_SetsAPassword, auth_views.PasswordChangeView):
    """Signs out the account's other sessions (Django keeps this one: ``update_session_auth_hash``)."""

    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:password")
    done = "Password changed. Your other sessions are signed out."

    def post(self, request, *args, **kwargs) -> HttpResponse:
        if wait := ratelimit.wait_past_rate(f"password-change:user:{request.user.pk}", f"{CHANGE_TRIES}/h"):
            context = self.get_context_data(form=self.form_class(user=request.user), too_many=wait // 60 + 1)
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)


@method_decorator(limit_posts(scope="password-reset"), name="dispatch")
class ResetPassword(auth_views.PasswordResetView):
    """Says the same whatever address is typed: nobody learns which addresses have accounts."""

    template_name = "accounts/password_reset.html"
    email_template_name = "accounts/email/password_reset.txt"
    subject_template_name = "accounts/email/password_reset_subject.txt"
    success_url = reverse_lazy("accounts:password-reset-sent")

    def form_valid(self, form) -> HttpResponse:
        hours = settings.PASSWORD_RESET_TIMEOUT // 3600
        self.extra_email_context = {
            "console": settings.E31_CONSOLE_URL.rstrip("/"),
            "valid_for": f"{hours // 24} days" if hours % 24 == 0 and hours > 24 else f"{hours} hours",
        }
        try:
            return super().form_valid(form)
        except (
            SMTPException,
            OSError,
        ):  # the same page whatever happened: it must not tell who has an account
            log.exception("a password reset link could not be sent")
            return redirect(self.success_url)


class ResetSent(auth_views.PasswordResetDoneView):
    template_name = "accounts/password_reset_sent.html"


class SetForgottenPassword(_SetsAPassword, auth_views.PasswordResetConfirmView):
    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("accounts:login")
    done = "Password set. Sign in with it."
