"""Manifests for the real tools: NodeHealthCheck, Chaos Mesh, AWS FIS, Kyverno, RBAC."""
