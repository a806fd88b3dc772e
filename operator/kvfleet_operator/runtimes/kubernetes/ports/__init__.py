"""The control loop's ports over the Kubernetes API (and `pods`, their pure reading)."""
