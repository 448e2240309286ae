"""The worker side: signal wiring (in one place), start checks, the main process's
renewal of its children's locks, dead-child reclaim, the hand-off sweeper, shutdown."""
