from django.urls import path

from jobs import views

app_name = "jobs"

urlpatterns = [
    path("", views.job_list, name="list"),
    path("new/", views.job_new, name="new"),
    path("new/estimate/", views.estimate, name="estimate"),
    path("queue/", views.queue, name="queue"),
    path("transfers/", views.transfers, name="transfers"),
    path("<int:job_id>/", views.job_detail, name="detail"),
    path("<int:job_id>/live/", views.job_live, name="live"),
    path("<int:job_id>/log/", views.job_log, name="log"),
    path("<int:job_id>/outputs/download/", views.job_output, name="output"),
    path("<int:job_id>/cancel/", views.job_cancel, name="cancel"),
    path("<int:job_id>/rerun/", views.job_rerun, name="rerun"),
    path("arrays/<int:array_id>/cancel/", views.array_cancel, name="array-cancel"),
]
