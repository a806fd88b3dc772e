"""kvfleet_sim."""
