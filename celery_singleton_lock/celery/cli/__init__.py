"""The ``celery locks`` sub-commands (the group is :mod:`celery_singleton_lock.command_line`)."""
