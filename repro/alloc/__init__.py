"""Profiling, budgeted allocation, depth transfer, analysis and resource accounting (RoPE spec 2-6)."""
