"""Scaling (notebook 08): memory per batch size, gradient accumulation, ChainerMN."""
