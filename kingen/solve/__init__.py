"""Simulation: the exact reference and the batched RK4 solver on CPU and GPU."""

from kingen.solve.batch import BatchResult, ObjectiveInputs, Simulator, simulate_batch
from kingen.solve.reference import ProtocolTrace, SweepTrace, simulate_exact

__all__ = ["BatchResult", "ObjectiveInputs", "ProtocolTrace", "Simulator", "SweepTrace",
           "simulate_batch", "simulate_exact"]
