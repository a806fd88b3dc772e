"""Runtimes apply the reconcile core's desired state somewhere: local processes or Kubernetes.

The control loop (`kvfleet_operator.controller`) is the same for both; a runtime only starts,
observes and stops replicas and pushes the router config.
"""
