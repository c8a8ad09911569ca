"""Submitting one declaration through each intake channel: the form, the job file, the API."""

import json

import tomli_w
from django.test import Client
from django.urls import reverse


def as_form_fields(raw: dict) -> dict[str, str]:
    work, request, output = raw.get("work", {}), raw.get("request", {}), raw.get("output", {})
    fields = {
        "action": "submit",
        "name": raw.get("name", ""),
        "work.argv": "\n".join(work.get("argv", []))
        if isinstance(work.get("argv"), list)
        else str(work.get("argv", "")),
        "work.env": "\n".join(f"{k}={v}" for k, v in work.get("env", {}).items()),
        "work.image": work.get("image", ""),
        "work.secrets": " ".join(map(str, work.get("secrets", []))),
        "work.workdir": work.get("workdir", ""),
        "request.gpus": str(request.get("gpus", "")),
        "request.hours": str(request.get("hours", "")),
        "request.min_gpus": "" if request.get("min_gpus") is None else str(request["min_gpus"]),
        "request.max_gpus": "" if request.get("max_gpus") is None else str(request["max_gpus"]),
        "request.memory": "" if request.get("memory") is None else str(request["memory"]),
        "request.cpus": "" if request.get("cpus") is None else str(request["cpus"]),
        "output.uri": output.get("uri", ""),
        "output.bytes": str(output.get("bytes", "")),
    }
    checkpoint = request.get("checkpoint") or {}
    for key in ("signal", "grace_s", "bytes"):
        if checkpoint.get(key) is not None:
            fields[f"request.checkpoint.{key}"] = str(checkpoint[key])
    for flag in ("preemptible", "requeue"):
        if request.get(flag):
            fields[f"request.{flag}"] = "on"
    for i, item in enumerate(raw.get("data", [])):
        for key in ("name", "uri", "bytes", "sha256"):
            fields[f"data[{i}].{key}"] = str(item.get(key, ""))
    return fields


def submit_form(client: Client, raw: dict):
    return client.post(reverse("jobs:new"), as_form_fields(raw))


def submit_file(client: Client, raw: dict):
    text = tomli_w.dumps({k: v for k, v in raw.items() if v is not None})
    return client.post(reverse("jobs:new"), {"action": "submit-file", "job_file": text})


def submit_api(client: Client, raw: dict, token: str):
    return client.post(
        "/api/v1/jobs",
        data=json.dumps(raw),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def error_fields(response) -> set[str]:
    """The field paths an API response or a rendered form names as wrong."""
    if response["Content-Type"].startswith("application/json"):
        return {e["field"] for e in response.json().get("errors", [])}
    return set(response.context["form"].errors)
