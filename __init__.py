"""hardwire: compile a small language model into hardware with the weights baked in."""

__version__ = "0.1.0"
