"""Two ``celery beat`` processes, one 5 s job every 2 s, never two runs at once."""
