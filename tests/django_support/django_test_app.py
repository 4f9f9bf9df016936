"""The ackwise app of tests/test_django.py (``ACKWISE_APP = "django_test_app:app"``); its
broker comes from ``DJANGO_TEST_BROKER``."""

import os

from ackwise import App

app = App("djangotest", broker=os.environ["DJANGO_TEST_BROKER"])
