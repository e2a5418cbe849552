"""Gateware for real boards and the flow that builds it.

The board core (core.py: the decoder behind its host link, host_link.py, receive_fifo.py, uart.py,
link_codes.py) and its top with pins and clock (top.py); the parts as numbers with the fit check
(parts.py, memories.py) and the engine sizing (sizing.py); the FPGA flow (fpga.py: yosys, nextpnr,
the packer) and the ASIC synthesis (asic.py). The host programs that talk to a board are in host/,
the testbenches that simulate one in sim/.
"""
