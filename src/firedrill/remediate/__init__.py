"""Remediation: GPU health policy and a controller with budgets that can never become the outage."""
