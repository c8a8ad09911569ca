"""URLs of the public pages, partner intake and the operators' pages for both (included at the root)."""

from django.urls import path

from public import feeds, views

urlpatterns = [
    path("unsolved/", views.unsolved, name="unsolved"),
    path("unsolved/feed/", feeds.UnsolvedFeed(), name="unsolved-feed"),
    path("operator/problems/new/", views.problem_new, name="problem-new"),
    path("operator/problems/<slug:slug>/edit/", views.problem_edit, name="problem-edit"),
    path("operator/problems/<slug:slug>/solve/", views.problem_solve, name="problem-solve"),
    path("operator/problems/<slug:slug>/reviewed/", views.problem_reviewed, name="problem-reviewed"),
    path("design-partners/", views.partners, name="partners"),
    path("design-partners/thanks/", views.partners_thanks, name="partners-thanks"),
    path("operator/partners/", views.partners_review, name="partners-review"),
    path("operator/partners/intake/", views.partners_intake, name="partners-intake"),
    path("operator/partners/<int:application_id>/", views.partners_application, name="partners-application"),
    path("operator/partners/<int:application_id>/accept/", views.partners_accept, name="partners-accept"),
    path("operator/partners/<int:application_id>/decline/", views.partners_decline, name="partners-decline"),
    path(
        "operator/partners/<int:application_id>/reinvite/", views.partners_reinvite, name="partners-reinvite"
    ),
    path("invite/<str:token>/", views.invite, name="invite"),
]
