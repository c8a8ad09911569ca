"""Sign-in pages and the API tokens page."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts import services
from accounts.models import ApiToken


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    new_token = None
    if request.method == "POST":
        label = request.POST.get("label", "").strip()[:80] or "token"
        _, new_token = services.create_api_token(user=request.user, label=label)
    rows = ApiToken.objects.filter(user=request.user)
    return render(request, "accounts/tokens.html", {"tokens": rows, "new_token": new_token})


@login_required
@require_POST
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    if services.revoke_api_token(token_id=token_id, user=request.user, now=timezone.now()):
        messages.success(request, "Token revoked: it no longer works.")
    return redirect("accounts:tokens")
