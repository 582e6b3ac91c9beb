"""Stress tests: processes killed at random moments, and the scripts that run them long."""
