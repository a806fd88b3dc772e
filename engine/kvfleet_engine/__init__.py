"""kvfleet_engine."""
