from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import passwords, views

app_name = "accounts"

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="accounts/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", passwords.ChangePassword.as_view(), name="password"),
    path("password-reset/", passwords.ResetPassword.as_view(), name="password-reset"),
    path("password-reset/sent/", passwords.ResetSent.as_view(), name="password-reset-sent"),
    path("reset/<uidb64>/<token>/", passwords.SetForgottenPassword.as_view(), name="password-reset-confirm"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.revoke_token, name="revoke-token"),
    path("secrets/", views.secrets_page, name="secrets"),
    path("secrets/<slug:team_slug>/delete/", views.delete_secret, name="delete-secret"),
]

urlpatterns += [
    path("teams/members/", views.members_home, name="members-home"),
    path("teams/<slug:team_slug>/members/", views.team_members, name="members"),
    path("teams/<slug:team_slug>/members/<int:user_id>/role/", views.change_member_role, name="member-role"),
    path("teams/<slug:team_slug>/members/<int:user_id>/remove/", views.remove_member, name="member-remove"),
    path(
        "teams/<slug:team_slug>/invitations/<int:invitation_id>/cancel/",
        views.cancel_invitation,
        name="invitation-cancel",
    ),
]
