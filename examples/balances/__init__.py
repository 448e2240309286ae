"""Concurrent balance updates: per-account locks and fencing tokens vs. plain tasks."""
