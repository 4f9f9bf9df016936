"""Settings of the example shop: PostgreSQL for the data (and the outbox), any ackwise broker
for the tasks.  Everything that differs between machines comes from the environment."""

import os

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop_site.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "ackwise.contrib.django",  # the ackwise app, task discovery, the outbox migration
    "orders",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_DB_NAME", "shop"),
        "USER": os.environ.get("SHOP_DB_USER", "postgres"),
        "HOST": os.environ.get("SHOP_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("SHOP_DB_PORT", "5432"),
        # e.g. "-c search_path=shop" to keep the tables in a schema of their own
        "OPTIONS": {"options": os.environ.get("SHOP_DB_OPTIONS", "")},
    }
}

#: The ackwise app ("module:attribute"); its tasks are the installed apps' tasks modules.
ACKWISE_APP = "shop_site.ackwise_app:app"
