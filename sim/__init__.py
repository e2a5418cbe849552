"""Simulation: cocotb + Verilator runs of the generated Verilog against the integer reference.

runner.py builds and runs a decoder simulation, tb_decoder.py is its testbench; sim_board.py does the
same for a whole board core, whose testbenches are tb_board.py (a chat session through the UART pins)
and tb_link.py with its bench tb_link_bench.py (the host link: buffers, overflow, the soak against
host/clocked_device.py); tools.py finds the simulators.
"""
