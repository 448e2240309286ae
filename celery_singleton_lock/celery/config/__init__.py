"""Configuration: the lock options of a task, which server(s) hold an app's locks, and the
lockers that talk to them."""
