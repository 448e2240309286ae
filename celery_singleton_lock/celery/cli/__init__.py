"""The command line: ``celery-singleton-lock`` and ``celery -A proj locks``."""
