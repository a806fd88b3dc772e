"""kvfleet_operator."""
