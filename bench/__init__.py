"""Benchmarks of celery-singleton-lock; run them with ``python -m bench`` (see bench/README.md)."""
