"""The task class and one execution's lock: ``LockedTask``, the lock scope from
``before_start`` to the release, and ``self.request.lock``."""
