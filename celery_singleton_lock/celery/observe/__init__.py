"""What an operator sees besides logs and events: metrics, trace events, the lock console."""
