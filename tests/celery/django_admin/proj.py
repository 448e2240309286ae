"""An app named by its dotted path in ``CELERY_SINGLETON_LOCK_APP`` (``proj:app``)."""

from celery import Celery

app = Celery("django-admin-proj", set_as_current=False)
