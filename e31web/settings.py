"""Settings for the E31 Network console.

One file, read from the environment. The defaults run the embedded console (SQLite and a
filesystem broker under ``var/``); production differences are environment values, not a
second settings tree.
"""

import ipaddress
import re
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Secrets may come from files (E31_SECRET_KEY_FILE=/run/secrets/...) as well as the environment.
environ.Env.smart_cast = True


# Every secret file a setting was read from: jobs never see them (the node agent checks at start).
SECRET_FILES: list[Path] = []


def _env_or_file(name: str, default: str | None = None) -> str | None:
    path = env.str(f"{name}_FILE", default="")
    if path:
        SECRET_FILES.append(Path(path).resolve())
        return Path(path).read_text().strip()
    return env.str(name, default=default)


def _path_list(name: str, default: str) -> list[Path]:
    """Colon-separated absolute directories, resolved (symlinks followed) once at start-up."""
    raw = env.str(name, default=default)
    paths = [Path(p).resolve() for p in raw.split(":") if p.strip()]
    if any(not Path(p).is_absolute() for p in raw.split(":") if p.strip()):
        raise ImproperlyConfigured(f"{name} must list absolute paths, got {raw!r}")
    return paths


def _s3_roots(name: str) -> list[str]:
    """Comma-separated s3://bucket[/prefix] roots, none inside another: a team's prefix of the outer root
    (``<root>/<slug>/``) must never hold another root, and with it other teams' prefixes."""
    roots = [root.strip().rstrip("/") for root in env.list(name, default=[]) if root.strip()]
    for root in roots:
        parts = urlsplit(root)
        if (
            parts.scheme != "s3"
            or not parts.hostname
            or "@" in parts.netloc
            or parts.port
            or "?" in root
            or "#" in root
        ):
            raise ImproperlyConfigured(f"{name} lists s3://bucket[/prefix] roots, got {root!r}")
    if nested := [(a, b) for a in roots for b in roots if a != b and b.startswith(a + "/")]:
        raise ImproperlyConfigured(f"{name}: {nested[0][1]} lies inside {nested[0][0]}; list roots apart")
    return roots


DEBUG = env.bool("E31_DEBUG", default=False)
PRODUCTION = env.bool("E31_PRODUCTION", default=False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("E31_DEBUG must be off when E31_PRODUCTION is set")
STATE_DIR = Path(env.str("E31_STATE_DIR", default=str(BASE_DIR / "var"))).resolve()

SECRET_KEY = _env_or_file("SECRET_KEY") or _env_or_file("E31_SECRET_KEY")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set in production")
    SECRET_KEY = "e31-development-only-not-secret"

ALLOWED_HOSTS = env.list("E31_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
if PRODUCTION and not env.str("E31_ALLOWED_HOSTS", default=""):
    raise ImproperlyConfigured("E31_ALLOWED_HOSTS must name the console's host names in production")
CSRF_TRUSTED_ORIGINS = env.list("E31_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    # Before auth: its createsuperuser (audited) replaces auth's, as its axes_reset* commands replace axes'. It
    # has no templates or static files to shadow auth's.
    "accounts",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "ninja",  # serves the API docs' Swagger UI from our own static files (CSP allows no CDN)
    "jobs",
    "metering",
    "operations",
    "axes",
    "common",
    "public",
    "notifications",
    "e31web",  # configuration only; installed for the migrations that created the public pages' tables
]

MIDDLEWARE = [
    # First: a client that stalls is dropped whatever the rest answers.
    "common.stalls.ClientStallMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "common.private.PrivateResponsesMiddleware",
    # Inside the headers' middleware, so its 400 carries them like any page.
    "common.nul.RefuseNulMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "common.denials.DenialLogMiddleware",
    # Innermost, so its 429 for a locked-out sign-in passes out through the denial log.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "e31web.urls"
WSGI_APPLICATION = "e31web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.membership",
            ],
        },
    },
]

# --- Database: SQLite by default, DATABASE_URL switches to PostgreSQL with no code change.
STATE_DIR.mkdir(parents=True, exist_ok=True)
# The URL carries a password, so it may come from a file too (DATABASE_URL_FILE=/run/secrets/...).
_SQLITE_URL = f"sqlite:///{STATE_DIR / 'e31.sqlite3'}"
DATABASES = {"default": env.db_url_config(_env_or_file("DATABASE_URL", _SQLITE_URL))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, workers and agents share the file: WAL lets readers run beside the single writer,
    # IMMEDIATE takes the write lock up front so two scheduler passes serialise instead of deadlocking.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A covering index (Index.include) is a plain index on SQLite: the same answers, read from the table.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("E31_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if test_name := env.str("E31_TEST_DB_NAME", default=""):
        DATABASES["default"]["TEST"] = {"NAME": test_name}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = STATE_DIR / "staticfiles"
# Serve static files straight from the source folders, so `make run` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# --- Security. Headers on every response; HTTPS-only cookies and HSTS when E31_PRODUCTION is set.
# The CSP allows only the console's own static files: no inline script or style, no CDN, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
    }
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# No script reads either cookie: htmx sends the CSRF token from the template (hx-headers on <body>).
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "common.errors.csrf_failure"  # the console's page: the form expired, cookies needed
SESSION_COOKIE_SAMESITE = "Lax"
# A session lasts a working day at most, and ends with the browser in production.
SESSION_COOKIE_AGE = env.int("E31_SESSION_AGE_S", default=12 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = env.bool("E31_SESSION_EXPIRE_AT_BROWSER_CLOSE", default=PRODUCTION)
# Sign-in: LIMIT failed sign-ins per (username, client address) are answered, the next get 429 until
# WINDOW seconds after the last failure (django-axes, configured in accounts.lockout).
E31_LOGIN_FAILURE_LIMIT = env.int("E31_LOGIN_FAILURE_LIMIT", default=10)
E31_LOGIN_WINDOW_S = env.int("E31_LOGIN_WINDOW_S", default=15 * 60)
# Failed sign-ins from one client address, whatever the usernames, within the window: far above one person's
# E31_LOGIN_FAILURE_LIMIT, so an office behind one address is not locked out by its typos.
E31_LOGIN_FAILURES_PER_ADDRESS = env.int("E31_LOGIN_FAILURES_PER_ADDRESS", default=100)
if E31_LOGIN_FAILURES_PER_ADDRESS < E31_LOGIN_FAILURE_LIMIT:
    raise ImproperlyConfigured("E31_LOGIN_FAILURES_PER_ADDRESS is at least E31_LOGIN_FAILURE_LIMIT")
# Usernames are matched whatever their case, or an account's e-mail address (accounts.backends).
AUTHENTICATION_BACKENDS = ["accounts.lockout.LockoutBackend", "accounts.backends.UsernameOrEmailBackend"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"  # rows every web process reads alike
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # the pair, never the username alone
AXES_FAILURE_LIMIT = "accounts.lockout.failure_limit"
AXES_COOLOFF_TIME = "accounts.lockout.window"
AXES_USERNAME_CALLABLE = "accounts.lockout.username"
AXES_CLIENT_IP_CALLABLE = "common.clients.client_network"  # an IPv6 client by its network
AXES_LOCKOUT_CALLABLE = "accounts.lockout.refused"
AXES_RESET_ON_SUCCESS = True
# Attempts refused while locked are not counted, so the lock ends WINDOW after the last real failure.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_VERBOSE = False  # refusals are logged once, on e31.denials
AXES_DISABLE_ACCESS_LOG = True  # failures are kept while they count; successful sign-ins are not recorded
if PRODUCTION:
    SECURE_SSL_REDIRECT = env.bool("E31_SSL_REDIRECT", default=True)
    # Load balancers probe over plain HTTP; the probe reads nothing private.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("E31_HSTS_SECONDS", default=365 * 86400)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("E31_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("E31_HSTS_PRELOAD", default=True)
    # Only behind a proxy that sets X-Forwarded-Proto itself (and drops the client's own).
    if env.bool("E31_TRUST_X_FORWARDED_PROTO", default=False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "jobs:list"
LOGOUT_REDIRECT_URL = "home"

# --- Caches: the rate limits (public forms, the API) live here, so every web process must share it:
# the database's cache table by default (created by migration common 0001), Redis when E31_CACHE_URL
# names it (redis://host:6379/N). Never one process's memory: two gunicorn workers would each count.
CACHES = {"default": env.cache_url_config(_env_or_file("E31_CACHE_URL", "dbcache://e31_cache"))}
# The client's address is the rightmost X-Forwarded-For hop that is not one of these proxies
# (addresses or CIDR ranges); with none listed, the peer address (common.clients).
E31_TRUSTED_PROXIES = env.list("E31_TRUSTED_PROXIES", default=[])
try:
    [ipaddress.ip_network(entry, strict=False) for entry in E31_TRUSTED_PROXIES]
except ValueError as exc:
    raise ImproperlyConfigured(f"E31_TRUSTED_PROXIES: {exc}") from exc
# The limits (sign-in lockout, public forms, the API, wrong /metrics tokens) count an IPv6 client by its network of this many
# leading bits: one home line or VM is given a whole /64, and each of its addresses would count afresh.
E31_IPV6_CLIENT_PREFIX = env.int("E31_IPV6_CLIENT_PREFIX", default=64)
if not 32 <= E31_IPV6_CLIENT_PREFIX <= 128:
    raise ImproperlyConfigured(
        f"E31_IPV6_CLIENT_PREFIX is a prefix length from 32 to 128 (64: a /64), not {E31_IPV6_CLIENT_PREFIX}"
    )
# The API: at most this many requests per token (per user for a browser session) per period.
E31_API_RATE = env.str("E31_API_RATE", default="600/m")
# How long a new API token lasts unless its maker chooses (days), and the most anyone may choose.
E31_TOKEN_DAYS = env.int("E31_TOKEN_DAYS", default=90)
E31_TOKEN_MAX_DAYS = env.int("E31_TOKEN_MAX_DAYS", default=365)
if not 1 <= E31_TOKEN_DAYS <= E31_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured("E31_TOKEN_DAYS is from 1 to E31_TOKEN_MAX_DAYS")
# The submit form's preview plans the queue up to four times: at most this many per member per period.
E31_PREVIEW_RATE = env.str("E31_PREVIEW_RATE", default="30/m")
for _name, _rate in (("E31_API_RATE", E31_API_RATE), ("E31_PREVIEW_RATE", E31_PREVIEW_RATE)):
    if not re.fullmatch(r"[1-9][0-9]*/[smhd][a-z]*", _rate):
        raise ImproperlyConfigured(f"{_name} is a count per period, such as 600/m or 20/s (not {_rate!r})")
# Public forms (waitlist, design-partner application): at most LIMIT posts per client per window.
E31_PUBLIC_FORM_LIMIT = env.int("E31_PUBLIC_FORM_LIMIT", default=5)
E31_PUBLIC_FORM_WINDOW_S = env.int("E31_PUBLIC_FORM_WINDOW_S", default=600)
# Once intake opens, beat writes to the waitlist every minute, this many addresses a run (the relay's pace).
E31_WAITLIST_MAILS_PER_RUN = env.int("E31_WAITLIST_MAILS_PER_RUN", default=100)
# /metrics: after LIMIT wrong bearer tokens from one client address in a clock-aligned window, that address gets
# 429 until the window ends (operations.metrics).
E31_METRICS_FAILURE_LIMIT = env.int("E31_METRICS_FAILURE_LIMIT", default=10)
E31_METRICS_FAILURE_WINDOW_S = env.int("E31_METRICS_FAILURE_WINDOW_S", default=600)
if E31_METRICS_FAILURE_LIMIT < 1 or E31_METRICS_FAILURE_WINDOW_S < 1:
    raise ImproperlyConfigured("E31_METRICS_FAILURE_LIMIT and E31_METRICS_FAILURE_WINDOW_S are at least 1")
# A team admin sends at most LIMIT invitations per window (accounts.views); an invitation link, a team's or a
# design partner's, lasts TTL seconds (accounts.members, public.services).
E31_TEAM_INVITE_LIMIT = env.int("E31_TEAM_INVITE_LIMIT", default=20)
E31_TEAM_INVITE_WINDOW_S = env.int("E31_TEAM_INVITE_WINDOW_S", default=3600)
E31_INVITATION_TTL_S = env.int("E31_INVITATION_TTL_S", default=7 * 86400)

# --- Email: the console backend in development.
EMAIL_BACKEND = env.str("E31_EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("E31_FROM_EMAIL", default="E31 Network <noreply@e31.invalid>")
# For E31_EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend (the password may come from a file).
EMAIL_HOST = env.str("E31_SMTP_HOST", default="localhost")
EMAIL_PORT = env.int("E31_SMTP_PORT", default=25)
EMAIL_HOST_USER = env.str("E31_SMTP_USER", default="")
EMAIL_HOST_PASSWORD = _env_or_file("E31_SMTP_PASSWORD", "") or ""
EMAIL_USE_TLS = env.bool("E31_SMTP_TLS", default=False)
EMAIL_TIMEOUT = 30
# A job's e-mail the mail server could not take is sent again after E31_EMAIL_BACKOFF_S, doubling, up to
# E31_EMAIL_ATTEMPTS sends; a 5xx refusal of the recipient (no such mailbox) is given up at once.
E31_EMAIL_ATTEMPTS = env.int("E31_EMAIL_ATTEMPTS", default=6)
E31_EMAIL_BACKOFF_S = env.float("E31_EMAIL_BACKOFF_S", default=60.0)

# --- Celery. The broker only rings the doorbell: PostgreSQL holds every state.
BROKER_DIR = STATE_DIR / "broker"
CELERY_BROKER_URL = _env_or_file("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("in", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport with whole-file writes and a reader that survives a bad file
    # (e31web/broker.py): kombu's own lets a reader see a half-written message and die.
    CELERY_BROKER_TRANSPORT = "e31web.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "in"),
        "data_folder_out": str(BROKER_DIR / "in"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
else:
    # A broker that is down must not hang a web request: the submission commits and the
    # reconciler dispatches it later. A hung Redis (connections accepted, never answered) would
    # block a publish forever without socket timeouts; they stay above kombu's 1 s BRPOP wait.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        CELERY_BROKER_TRANSPORT_OPTIONS |= {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
# After a failed publish a process skips the broker this long (jobs.dispatch); the reconciler re-drives.
E31_BROKER_QUIET_S = env.float("E31_BROKER_QUIET_S", default=5.0)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env.str("E31_CONTROL_QUEUE", default="control")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_PUBLISH_RETRY = False
CELERY_BROKER_CONNECTION_TIMEOUT = 2

# --- The pool and its jobs.
E31_DATA_ROOTS = _path_list("E31_DATA_ROOTS", str(STATE_DIR / "datasets"))
E31_OUTPUT_ROOTS = _path_list("E31_OUTPUT_ROOTS", str(STATE_DIR / "outputs"))
for _root in (*E31_DATA_ROOTS, *E31_OUTPUT_ROOTS):
    try:
        _root.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # a root on a mount the web process cannot create: validation still refuses paths outside it
# s3:// is read and written with the pool's own credentials, so only under operator-named roots, a prefix
# per team: comma-separated s3://bucket[/prefix]; none (the default) refuses s3:// altogether.
E31_S3_ROOTS = _s3_roots("E31_S3_ROOTS")
E31_AGENT_ROOT = Path(env.str("E31_AGENT_ROOT", default=str(STATE_DIR / "agents"))).resolve()
E31_STAGING_ROOT = Path(env.str("E31_STAGING_ROOT", default=str(STATE_DIR / "staging"))).resolve()
E31_MAX_JOB_HOURS = env.float("E31_MAX_JOB_HOURS", default=168.0)
# The largest output a job may declare: its attempt space is an image of that size, and ext4 stops at 16 TiB.
E31_MAX_OUTPUT_BYTES = env.int("E31_MAX_OUTPUT_BYTES", default=2**40)
# A pausable job's checkpoint directory: at most this much, kept between its attempts under
# E31_CHECKPOINT_ROOT (a pool spanning machines mounts it from shared storage on every node).
E31_MAX_CHECKPOINT_BYTES = env.int("E31_MAX_CHECKPOINT_BYTES", default=2**40)
# What one team's jobs not yet ended may declare of checkpoint space together (each image is allocated whole).
E31_TEAM_CHECKPOINT_BYTES = env.int("E31_TEAM_CHECKPOINT_BYTES", default=2 * 2**40)
if E31_TEAM_CHECKPOINT_BYTES < 0:
    raise ImproperlyConfigured(
        "E31_TEAM_CHECKPOINT_BYTES is not negative (0: no team may declare a checkpoint)"
    )
E31_CHECKPOINT_ROOT = Path(env.str("E31_CHECKPOINT_ROOT", default=str(STATE_DIR / "checkpoints"))).resolve()


def _refuse_nested_roots() -> None:
    """A team's file:// folder is <root>/<team-slug>/: a root inside another would be some team's own folder of
    the outer one (team "outputs" reading every team's deliveries under <data root>/outputs), and a platform
    folder inside a root (the staging cache, agents' spaces, checkpoints, the state folder with its database,
    keys and broker) a team's folder too. One folder may be
    both a data and an output root: each team's folder of it is its own either way."""
    named = [
        *(("E31_DATA_ROOTS", p) for p in E31_DATA_ROOTS),
        *(("E31_OUTPUT_ROOTS", p) for p in E31_OUTPUT_ROOTS),
    ]
    platform = [("E31_STAGING_ROOT", E31_STAGING_ROOT), ("E31_AGENT_ROOT", E31_AGENT_ROOT),
                ("E31_CHECKPOINT_ROOT", E31_CHECKPOINT_ROOT), ("E31_STATE_DIR", STATE_DIR)]  # fmt: skip
    for outer_name, outer in named:
        for inner_name, inner in (*named, *platform):
            same_root = inner == outer and (inner_name, inner) in named
            if inner.is_relative_to(outer) and not same_root:
                raise ImproperlyConfigured(
                    f"{inner_name} {inner} lies inside {outer_name} {outer}: a team named like the folder between "
                    "them would reach it as its own; list the roots side by side"
                )


_refuse_nested_roots()
E31_HEARTBEAT_S = env.float("E31_HEARTBEAT_S", default=5.0)
# How often an agent looks for its GPUs again (a GPU that fell off the bus), and samples them.
E31_GPU_RESCAN_S = env.float("E31_GPU_RESCAN_S", default=30.0)
E31_GPU_SAMPLE_S = env.float("E31_GPU_SAMPLE_S", default=5.0)
E31_NODE_TIMEOUT_S = env.float("E31_NODE_TIMEOUT_S", default=30.0)
# The machine a node agent says it runs on (empty: its machine-id, else its host name): set it for an agent in a
# container, whose host name changes with each container, so that its next container is taken for the same machine.
E31_NODE_HOST_ID = env.str("E31_NODE_HOST_ID", default="")
E31_KILL_GRACE_S = env.float("E31_KILL_GRACE_S", default=10.0)
E31_RECONCILE_AFTER_S = env.float("E31_RECONCILE_AFTER_S", default=60.0)
E31_RECONCILE_EVERY_S = env.float("E31_RECONCILE_EVERY_S", default=15.0)
E31_SCHEDULER_TICK_S = env.float("E31_SCHEDULER_TICK_S", default=30.0)
E31_FAIRSHARE_HALF_LIFE_S = env.float("E31_FAIRSHARE_HALF_LIFE_S", default=7 * 86400.0)
# Finished jobs a team needs before the scheduler plans with its learned run times (jobs.scheduling.prediction).
E31_PREDICTION_MIN_JOBS = env.int("E31_PREDICTION_MIN_JOBS", default=5)
# Until a transfer reports its own rate, staging ETAs assume this many bytes per second.
E31_ASSUMED_STAGE_RATE = env.float("E31_ASSUMED_STAGE_RATE", default=200e6)
# Staging and delivery transfers (jobs.staging, jobs.delivery, jobs.transfers).
# The pool-wide staging cache: least recently used entries no unreleased job pins are evicted past
# this many bytes, and any unpinned entry once unused for the retention period.
E31_STAGE_CACHE_BYTES = env.int("E31_STAGE_CACHE_BYTES", default=200 * 10**9)
# What one team's inputs (copies in progress, those its live jobs pin) and images may hold of it at once.
E31_STAGE_TEAM_SHARE = env.float("E31_STAGE_TEAM_SHARE", default=0.5)
if not 0 < E31_STAGE_TEAM_SHARE <= 1:
    raise ImproperlyConfigured("E31_STAGE_TEAM_SHARE is above 0 and at most 1")
E31_STAGE_RETENTION_S = env.float("E31_STAGE_RETENTION_S", default=7 * 86400.0)
# An image's unpacked root may hold at most this many times its compressed layers' bytes, and its whole entry no
# more than the cache's room: unpacking stops past either. Real images unpack to 2-4 times their layers; gzip lets
# a layer of zeros unpack to 1000 times (zstd to far more), so an image of a few MB could otherwise take the
# cache, and the disk agent roots and checkpoints share with it. 10 leaves room for text-heavy images.
E31_IMAGE_UNPACK_RATIO = env.int("E31_IMAGE_UNPACK_RATIO", default=10)
if E31_IMAGE_UNPACK_RATIO < 1:
    raise ImproperlyConfigured("E31_IMAGE_UNPACK_RATIO is a whole number of at least 1")
# Inputs copied at once across the pool, and deliveries at once per node.
E31_STAGE_CONCURRENCY = env.int("E31_STAGE_CONCURRENCY", default=4)
E31_DELIVERY_CONCURRENCY = env.int("E31_DELIVERY_CONCURRENCY", default=2)
# Of those, the most one team's copies and pulls may hold at once. Half by default: a team's slow sources (just
# above E31_TRANSFER_MIN_RATE_BPS, 25 GB lasts 69 hours) took every slot, and every other team's staging waited
# for them; half leaves the other half to the other teams, and still lets one team alone use two slots at a time.
E31_STAGE_TEAM_SLOTS = env.int("E31_STAGE_TEAM_SLOTS", default=max(1, E31_STAGE_CONCURRENCY // 2))
# A part's outputs lie on the node that sealed them: once that node has been down this long, its delivery fails
# (the job's dependents then go on) instead of waiting for it for ever.
E31_DELIVERY_NODE_GRACE_S = env.float("E31_DELIVERY_NODE_GRACE_S", default=86400.0)
# Transient errors (dropped connections, 5xx, timeouts) are retried this often, backing off from this delay.
E31_TRANSFER_RETRIES = env.int("E31_TRANSFER_RETRIES", default=4)
E31_TRANSFER_BACKOFF_S = env.float("E31_TRANSFER_BACKOFF_S", default=1.0)
E31_TRANSFER_TIMEOUT_S = env.float("E31_TRANSFER_TIMEOUT_S", default=30.0)
# A source slower than this on average over the window is dropped and retried like a stall (0: no floor):
# the pool has few transfer slots, and one that trickles would hold its slot for days.
E31_TRANSFER_MIN_RATE_BPS = env.float("E31_TRANSFER_MIN_RATE_BPS", default=100_000.0)
E31_TRANSFER_MIN_RATE_WINDOW_S = env.float("E31_TRANSFER_MIN_RATE_WINDOW_S", default=60.0)
if E31_TRANSFER_MIN_RATE_BPS < 0 or E31_TRANSFER_MIN_RATE_WINDOW_S <= 0:
    raise ImproperlyConfigured(
        "E31_TRANSFER_MIN_RATE_BPS is a rate of at least 0 (0: no floor) and E31_TRANSFER_MIN_RATE_WINDOW_S a number"
        " of seconds above 0"
    )
# http(s) sources on loopback, link-local or private addresses reach the pool's own network: off by default.
E31_ALLOW_PRIVATE_SOURCES = env.bool("E31_ALLOW_PRIVATE_SOURCES", default=False)
# A file:// source with several hard links may have a name outside the data roots: refused by default.
E31_ALLOW_HARDLINKED_SOURCES = env.bool("E31_ALLOW_HARDLINKED_SOURCES", default=False)
# Registries the pool runs itself (host or host:port): reached even on private addresses, over plain
# HTTP or TLS without verification. Every other registry needs verified TLS on a public address.
E31_POOL_REGISTRIES = env.list("E31_POOL_REGISTRIES", default=[])
# Pulls from any other registry: off until an operator allows them. The registry's own address is
# checked, and so is every redirect and token realm it names: skopeo's connections go through an egress proxy
# that connects only to checked addresses (jobs/transfers/egress.py).
E31_OUTSIDE_REGISTRIES = env.bool("E31_OUTSIDE_REGISTRIES", default=False)


def _networks(name: str) -> list:
    """Comma-separated CIDR networks (a bare address is its own /32 or /128)."""
    raw = env.str(name, default="")
    try:
        return [ipaddress.ip_network(part.strip(), strict=False) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} lists networks such as 10.1.0.0/16,fd00::/8: {exc}") from exc


# Webhooks reach public addresses only, plus the private networks listed here; never the platform's
# own services (database, broker, cache), the jobs' subnet, the nodes, the sending host's addresses, nor
# E31_WEBHOOK_DENY.
E31_WEBHOOK_PRIVATE_NETWORKS = _networks("E31_WEBHOOK_PRIVATE_NETWORKS")
E31_WEBHOOK_DENY = _networks("E31_WEBHOOK_DENY")
E31_WEBHOOK_ATTEMPTS = env.int("E31_WEBHOOK_ATTEMPTS", default=6)
E31_WEBHOOK_BACKOFF_S = env.float("E31_WEBHOOK_BACKOFF_S", default=10.0)  # doubles after each failed try
E31_WEBHOOK_TIMEOUT_S = env.float("E31_WEBHOOK_TIMEOUT_S", default=10.0)
# How long a webhook whose receiver did not answer several tries in a row is left untried.
E31_WEBHOOK_PAUSE_S = env.int("E31_WEBHOOK_PAUSE_S", default=600)
# Each event of a team's jobs goes out to every one of its webhooks from inside the job's change.
E31_WEBHOOKS_PER_TEAM = env.int("E31_WEBHOOKS_PER_TEAM", default=10)
# A delivered (or given up) webhook event and its tries are kept this many days, then removed.
E31_WEBHOOK_KEEP_DAYS = env.int("E31_WEBHOOK_KEEP_DAYS", default=30)
if E31_WEBHOOK_KEEP_DAYS < 1:
    raise ImproperlyConfigured("E31_WEBHOOK_KEEP_DAYS is at least 1")
# The console's address as its users reach it, for the links in e-mails.
E31_CONSOLE_URL = env.str("E31_CONSOLE_URL", default="http://127.0.0.1:8000")
if PRODUCTION and not env.str("E31_CONSOLE_URL", default="").startswith("https://"):
    # Every e-mailed link starts with it, single-use invitations that make accounts among them.
    raise ImproperlyConfigured("E31_CONSOLE_URL must be the console's https:// address in production")
if min(E31_STAGE_CONCURRENCY, E31_DELIVERY_CONCURRENCY) < 1 or E31_STAGE_CACHE_BYTES < 0:
    raise ImproperlyConfigured(
        "E31_STAGE_CONCURRENCY and E31_DELIVERY_CONCURRENCY are at least 1; E31_STAGE_CACHE_BYTES is not negative"
    )
if not 1 <= E31_STAGE_TEAM_SLOTS <= E31_STAGE_CONCURRENCY:
    raise ImproperlyConfigured("E31_STAGE_TEAM_SLOTS is at least 1 and at most E31_STAGE_CONCURRENCY")
E31_MAX_ATTEMPTS = env.int("E31_MAX_ATTEMPTS", default=3)
# After a node's disk could not hold an attempt's space, the scheduler places nothing there for this long.
E31_NO_ROOM_HOLD_S = env.float("E31_NO_ROOM_HOLD_S", default=300.0)
E31_LOG_CAP_BYTES = env.int("E31_LOG_CAP_BYTES", default=10 * 1024 * 1024)
# Every log a team's jobs wrote, held in the database together: past it a part's log stops with a note saying why.
E31_TEAM_LOG_BYTES = env.int("E31_TEAM_LOG_BYTES", default=2 * 1024**3)
if E31_TEAM_LOG_BYTES < 1024**2:
    raise ImproperlyConfigured("E31_TEAM_LOG_BYTES is at least 1 MiB (1048576)")
# A job's log is kept this many days after the job ends, then removed (its events and ledger rows stay).
E31_LOG_KEEP_DAYS = env.int("E31_LOG_KEEP_DAYS", default=90)
if E31_LOG_KEEP_DAYS < 1:
    raise ImproperlyConfigured("E31_LOG_KEEP_DAYS is at least 1")
# Log followers (GET /api/v1/jobs/{id}/log?wait=) that may wait at once per web process; the others are told to
# retry in 2 s. With E31_EXPORTS_PER_PROCESS it stays under gunicorn's threads (gunicorn.conf.py refuses to start
# otherwise): 2 and 2 under 4 threads let one member of two teams hold every thread (common.web_threads).
E31_LOG_WAITERS_PER_PROCESS = env.int("E31_LOG_WAITERS_PER_PROCESS", default=1)
# Ledger exports and output and log downloads one web process sends at once (each holds a thread while its client
# reads); others get a 429.
E31_EXPORTS_PER_PROCESS = env.int("E31_EXPORTS_PER_PROCESS", default=2)
# Seconds a client may leave a read or a write of its connection waiting (common.stalls): then it is dropped, and
# the thread and sending place it held are given back.
E31_CLIENT_STALL_S = env.float("E31_CLIENT_STALL_S", default=60.0)
if E31_CLIENT_STALL_S <= 0:
    raise ImproperlyConfigured("E31_CLIENT_STALL_S is a number of seconds above 0")
# Of those, what one team's (or the operators' whole-pool exports) may hold at once: no team takes every team's.
E31_EXPORTS_PER_TEAM = env.int("E31_EXPORTS_PER_TEAM", default=1)
if not 1 <= E31_EXPORTS_PER_TEAM <= E31_EXPORTS_PER_PROCESS:
    raise ImproperlyConfigured("E31_EXPORTS_PER_TEAM is from 1 to E31_EXPORTS_PER_PROCESS")
# An attempt that writes more files than this ends output_failed; its manifest is never built.
E31_MAX_OUTPUT_FILES = env.int("E31_MAX_OUTPUT_FILES", default=10_000)
E31_MAX_ARRAY = env.int("E31_MAX_ARRAY", default=1000)  # tasks in one array
# Tasks one team may have waiting (submitted, staging or queued) at once; a submission past it is refused (422).
# Each scheduler pass reads, plans and writes every waiting job under the one pass lock, which every start waits
# for: measured on a 2-CPU machine with local PostgreSQL, a pass took 0.4 s with 470 waiting, 0.6 s with 970,
# 1.3 s with 1,970 and 2.7 s with 3,970. 2,000 holds two full arrays (E31_MAX_ARRAY) and keeps one team's flood
# near a second a pass.
E31_MAX_WAITING_PER_TEAM = env.int("E31_MAX_WAITING_PER_TEAM", default=2000)
# Tasks one team may submit in any hour, cancelled ones too (each stays on record): a cancel frees the waiting cap,
# so without it a token submitting and cancelling full arrays grew the database by 1,000 jobs a round.
E31_MAX_SUBMITTED_PER_TEAM_HOUR = env.int("E31_MAX_SUBMITTED_PER_TEAM_HOUR", default=10000)
if E31_MAX_SUBMITTED_PER_TEAM_HOUR < E31_MAX_ARRAY:  # else the largest array could never be submitted
    raise ImproperlyConfigured("E31_MAX_SUBMITTED_PER_TEAM_HOUR is at least E31_MAX_ARRAY")
E31_ALLOW_UNSANDBOXED = env.bool("E31_ALLOW_UNSANDBOXED", default=False)
# Per-attempt bounds beside memory and CPUs (which come from the declaration or the node's share):
# processes and threads, and writable space on top of the declared output bytes.
E31_ATTEMPT_PIDS = env.int("E31_ATTEMPT_PIDS", default=4096)
# Kept back from what a node offers its jobs, for the agent and the system (unset: a twentieth of its memory, at
# least 512 MiB, never over half).
E31_NODE_RESERVED_MEMORY_BYTES = env.int("E31_NODE_RESERVED_MEMORY_BYTES", default=None)
if (E31_NODE_RESERVED_MEMORY_BYTES or 0) < 0:
    raise ImproperlyConfigured("E31_NODE_RESERVED_MEMORY_BYTES is not negative (0 keeps nothing back)")
E31_SCRATCH_BYTES = env.int("E31_SCRATCH_BYTES", default=10 * 10**9)
if E31_ATTEMPT_PIDS < 16 or E31_SCRATCH_BYTES < 0:
    raise ImproperlyConfigured("E31_ATTEMPT_PIDS is at least 16; E31_SCRATCH_BYTES is not negative")
# Each agent runs every attempt under a uid of its own from this range (agents on one machine need
# disjoint ranges: `node_agent --uid-base`); an attempt's directory is removed this long after delivery.
E31_JOB_UID_BASE = env.int("E31_JOB_UID_BASE", default=200000)
E31_JOB_UID_COUNT = env.int("E31_JOB_UID_COUNT", default=1000)
# Machine-wide: each root agent locks a file named after its uid range here and refuses one overlapping a live agent's.
E31_UID_REGISTRY = Path(env.str("E31_UID_REGISTRY", default="/run/e31/uid-ranges"))
E31_ATTEMPT_RETENTION_S = env.float("E31_ATTEMPT_RETENTION_S", default=86400.0)
# Per-minute GPU samples of allocations are kept this many days, then folded into one summary per allocation.
E31_GPU_MINUTES_KEEP_DAYS = env.int("E31_GPU_MINUTES_KEEP_DAYS", default=30)
if E31_GPU_MINUTES_KEEP_DAYS < 1:
    raise ImproperlyConfigured("E31_GPU_MINUTES_KEEP_DAYS is at least 1")
# Where the agent finds /dev/nvidia* (tests point it at fake device nodes).
E31_DEVICE_ROOT = Path(env.str("E31_DEVICE_ROOT", default="/dev"))
# Parts of jobs spanning nodes get addresses from here: each node owns the lowest /24 free when it registers
# (jobs/nodes.py; route it to that node).
E31_JOB_SUBNET = env.str("E31_JOB_SUBNET", default="100.64.0.0/10")
try:
    if ipaddress.IPv4Network(E31_JOB_SUBNET).prefixlen > 24:
        raise ValueError(E31_JOB_SUBNET)
except ValueError as _exc:
    raise ImproperlyConfigured(
        f"E31_JOB_SUBNET is an IPv4 network of /24 or wider, such as 100.64.0.0/10: {_exc}"
    ) from _exc
# Team secrets are encrypted at rest under keys of their own, never SECRET_KEY: comma-separated Fernet keys,
# the first encrypts and every one decrypts (rotation: put a new key first, run `manage.py rotate_secrets_key`,
# then drop the old one). Unset outside production: a key made once in E31_STATE_DIR/secrets.key (0600).
E31_SECRETS_KEYS = [k.strip() for k in (_env_or_file("E31_SECRETS_KEYS") or "").split(",") if k.strip()]
if PRODUCTION and not E31_SECRETS_KEYS:
    raise ImproperlyConfigured("E31_SECRETS_KEYS (or E31_SECRETS_KEYS_FILE) must be set in production")
E31_SECRETS_KEY_FILE = STATE_DIR / "secrets.key"
# Networks a job with egress never reaches besides the private ranges (jobs.network.NEVER_REACHED): the
# public addresses of the console, load balancer and nodes, comma-separated CIDRs.
E31_EGRESS_DENY = env.list("E31_EGRESS_DENY", default=[])
try:
    [ipaddress.IPv4Network(_net, strict=False) for _net in E31_EGRESS_DENY]
except ValueError as _exc:
    raise ImproperlyConfigured(f"E31_EGRESS_DENY lists IPv4 addresses or networks: {_exc}") from _exc
E31_DEMO_PASSWORD = env.str("E31_DEMO_PASSWORD", default="")
# A rate card is display-only and unset by default: no money appears anywhere without it.
E31_RATE_PER_GPU_HOUR = env.str("E31_RATE_PER_GPU_HOUR", default="")
# /metrics (operations/metrics.py): the bearer token Prometheus sends. Unset, the endpoint answers 404 to everyone.
# Long enough not to be guessed: it guards pool data on an endpoint open to the network.
E31_METRICS_TOKEN = _env_or_file("E31_METRICS_TOKEN") or ""
if E31_METRICS_TOKEN and len(E31_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("E31_METRICS_TOKEN (or E31_METRICS_TOKEN_FILE) is 16 characters or more")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("E31_LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}


# --- Beat: the periodic safety nets. Every state lives in the database; these only re-drive it.
# A pass lives at least this long: the worker judges expiry by its own clock, so a pass a few seconds old (a
# worker busy a moment, a clock a little ahead of beat's on another host) still runs.
BEAT_PASS_MIN_LIFE_S = 60.0


def _every(task: str, period_s: float, queue: str = "") -> dict:
    """A pass that expires after its own period (at least ``BEAT_PASS_MIN_LIFE_S``): by then the next one is on
    its way, so one no worker took (the control worker down) is dropped by the broker instead of piling up and
    being replayed. ``queue``: where it runs, if not on the control queue."""
    options = {"expires": max(period_s, BEAT_PASS_MIN_LIFE_S), **({"queue": queue} if queue else {})}
    return {"task": task, "schedule": period_s, "options": options}


CELERY_BEAT_SCHEDULE = {
    "reap-silent-nodes": _every("jobs.tasks.reap_silent_nodes", max(1.0, E31_HEARTBEAT_S)),
    "reconcile-stuck-jobs": _every("jobs.tasks.reconcile", E31_RECONCILE_EVERY_S),
    "sweep-staging-cache": _every("jobs.tasks.sweep_cache", 600.0),
    "prune-gpu-minutes": _every("jobs.tasks.prune_gpu_minutes", 3600.0),
    # Housekeeping: what grows with use is bounded (the ledger, the audit log and job events are kept).
    "prune-job-logs": _every("jobs.tasks.prune_logs", 3600.0),
    "clear-expired-sessions": _every("operations.tasks.clear_expired_sessions", 3600.0),
    "prune-webhook-deliveries": _every("operations.tasks.prune_webhook_deliveries", 3600.0),
    "forget-submission-keys": _every("operations.tasks.forget_submission_keys", 3600.0),
    "scheduler-safety-pass": _every("jobs.tasks.run_safety_pass", E31_SCHEDULER_TICK_S),
    "accrue-meter-hourly": _every(
        "metering.tasks.accrue_meter", env.float("E31_ACCRUE_EVERY_S", default=300.0)
    ),
    # The operator dashboard: beat's own sign of life, a utilisation sample per minute, the ledger check.
    "operations-beat-heartbeat": _every("operations.tasks.beat_heartbeat", 15.0),
    "operations-utilisation-sample": _every("operations.tasks.sample_utilisation", 60.0),
    "notifications-send-due": _every("notifications.tasks.send_due_notifications", 5.0),
    # Mail waits on the relay: on the notify queue's workers, never the control queue's (jobs.dispatch.notify_queue).
    "public-tell-waitlist": _every(
        "public.tasks.tell_waitlist", 60.0, queue=f"{CELERY_TASK_DEFAULT_QUEUE}.notify"
    ),
    "operations-ledger-check": _every(
        "operations.tasks.check_ledger", env.float("E31_LEDGER_CHECK_EVERY_S", default=600.0)
    ),
}
