"""Simulated execution: the executor that predicts a step's duration with the cost
model instead of computing it, and the fitting of that cost model (from profiled
runner steps or from the step records of real runs).
"""
