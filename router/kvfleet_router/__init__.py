"""kvfleet_router."""
