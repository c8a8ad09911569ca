from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import throttle, views

app_name = "accounts"

urlpatterns = [
    path("login/", throttle.login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.revoke_token, name="revoke-token"),
]
