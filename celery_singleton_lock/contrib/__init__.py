"""Integrations with other frameworks, each an edge of the package: imported only by the
user's own configuration (``INSTALLED_APPS``), never by the package itself."""
