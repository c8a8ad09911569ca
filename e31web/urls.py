from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView

from common import errors, health
from e31web.api import api
from operations import metrics
from public import views as public_views

urlpatterns = [
    path("", public_views.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    # Pages without the layout (a raw log, the API's JSON) name no icon, so browsers ask for this one.
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)("favicon.svg")), name="favicon"),
    path("metrics", metrics.metrics_view, name="metrics"),  # Prometheus: the token or an operator
    # The public pages (unsolved problems, design partners), invitations and their operator pages.
    path("", include("public.urls")),
    path("accounts/", include("accounts.urls")),
    path("jobs/", include("jobs.urls")),
    path("ledger/", include("metering.urls")),
    path("notifications/", include("notifications.urls")),
    path("operator/", include("operations.urls")),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]

# A request refused before any view (too large, malformed) gets the console's page, not Django's bare one.
handler400 = errors.bad_request
handler404 = errors.not_found
